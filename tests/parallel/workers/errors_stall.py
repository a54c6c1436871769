"""A rank that is late submits its tensor: the coordinator warns about the
stall (naming the missing rank), and the collective completes once it comes."""
import time

import numpy as np

import commlib
from _common import check_equal, done

commlib.init()
r, n = commlib.rank(), commlib.size()
if r == n - 1:
    time.sleep(3.5)
got = commlib.allreduce(np.ones(4), name="late", op=commlib.Sum)
check_equal(got, np.full(4, float(n)), "late allreduce")
done()

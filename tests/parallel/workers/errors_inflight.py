"""A name already in flight is refused before anything is sent; async
handles complete in any order of synchronization."""
import numpy as np

import commlib
from _common import check_equal, done, expect_raises

commlib.init()
r, n = commlib.rank(), commlib.size()
h = commlib.allreduce_async(np.ones(8), name="dup", op=commlib.Sum)
expect_raises(ValueError, lambda: commlib.allreduce_async(np.ones(8), name="dup"), "name in flight",
              match="already in flight")
check_equal(commlib.synchronize(h), np.full(8, float(n)), "the first request still completes")
expect_raises(ValueError, lambda: commlib.synchronize(h), "synchronize twice")
# Now the name is free again.
check_equal(commlib.allreduce(np.ones(8), name="dup", op=commlib.Sum), np.full(8, float(n)), "reuse")
done()

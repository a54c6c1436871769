"""A request that only rank 0 submitted is pending when every rank shuts
down (cached names in flight before): rank 0's handle fails, and after
init() again collectives, cached or not, work on every rank."""
import numpy as np

import commlib
from _common import check_equal, done, expect_raises

commlib.init()
r, n = commlib.rank(), commlib.size()
for _ in range(3):  # "after" is in the response cache before the shutdown
    commlib.allreduce(np.ones(2), name="after", op=commlib.Sum)
if r == 0:
    pending = commlib.allreduce_async(np.ones(2), name="only.rank0")
commlib.barrier()
commlib.shutdown()
if r == 0:
    expect_raises(commlib.NotInitializedError, lambda: commlib.synchronize(pending),
                  "the request pending at shutdown")
commlib.init()
for i in range(3):
    check_equal(commlib.allreduce(np.full(2, r + 1.0), name="after", op=commlib.Sum),
                np.full(2, n * (n + 1) / 2), f"cached name after re-init, call {i}")
    check_equal(commlib.allreduce(np.full(3, float(i)), op=commlib.Sum), np.full(3, i * n * 1.0),
                f"unnamed allreduce after re-init, call {i}")
done()
commlib.shutdown()

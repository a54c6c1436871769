"""A request that only rank 0 submitted is pending when every rank shuts
down (cached names in flight before): rank 0's handle fails, and after
init() again collectives, cached or not, and point-to-point work on every
rank (departure notices and goodbyes sent late in the first session must not
reach the second: MPI reuses the freed communicators' context ids)."""
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
    got = commlib.sendrecv(np.full(4, r * 10 + i), dst=(r + 1) % n, src=(r - 1) % n, send_tag=i,
                           recv_tag=i)
    check_equal(got, np.full(4, ((r - 1) % n) * 10 + i), f"sendrecv after re-init, call {i}")
commlib.barrier()  # (a rank 0 gone ends the others' communication, sends included)
done()
commlib.shutdown()

"""A rank that shuts down while others wait for it: they raise
NotInitializedError naming that rank instead of hanging."""
import time

import numpy as np

import commlib
from _common import done, expect_raises, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
commlib.allreduce(np.ones(2), name="warmup")
if r == n - 1:
    commlib.shutdown()
    expect_raises(commlib.NotInitializedError, lambda: commlib.allreduce(np.ones(2)),
                  "collective after own shutdown", match="not initialized")
    print(f"rank {r}: OK", flush=True)
else:
    start = time.monotonic()
    err = expect_raises(commlib.NotInitializedError,
                        lambda: commlib.allreduce(np.ones(2), name="after"), "waiting on a rank that left")
    if r != 0 and "rank 0" not in str(err) and f"rank {n - 1}" not in str(err):
        fail(f"error names no rank: {err}")
    if r == 0 and f"rank {n - 1}" not in str(err):
        fail(f"error does not name rank {n - 1}: {err}")
    if time.monotonic() - start > 30:
        fail("took too long")
    done()

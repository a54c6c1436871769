"""Departures and stalls while requests wait at a response cache bit.

argv[1] == "shutdown": rank argv[2] calls shutdown() while the others wait
for a cached request; they raise NotInitializedError naming it, quickly.
argv[1] == "stall": the last rank submits a cached request 4 s late; the
others' requests go to the coordinator, whose warning names the missing rank
(COMMLIB_STALL_CHECK_TIME=1), and all complete.
"""
import sys
import time

import numpy as np

import commlib
from _common import check_equal, done, expect_raises, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
mode = sys.argv[1]
for k in range(5):  # the name now has a cache bit
    check_equal(commlib.allreduce(np.ones(3), name="steady", op=commlib.Sum), np.full(3, float(n)), "warm-up")
if commlib.response_cache_stats()["hits"] < 2:
    fail(f"warm-up should hit the cache: {commlib.response_cache_stats()}")

if mode == "shutdown":
    leaver = int(sys.argv[2])
    if r == leaver:
        time.sleep(0.5)  # the others are waiting at the bit by now
        commlib.shutdown()
        print(f"rank {r}: OK", flush=True)
    else:
        start = time.monotonic()
        err = expect_raises(commlib.NotInitializedError,
                            lambda: commlib.allreduce(np.ones(3), name="steady", op=commlib.Sum),
                            "cached request while a rank shuts down")
        if f"rank {leaver}" not in str(err):
            fail(f"error does not name rank {leaver}: {err}")
        if time.monotonic() - start > 20:
            fail("took too long")
        done()
elif mode == "stall":
    if r == n - 1:
        time.sleep(4)
    check_equal(commlib.allreduce(np.ones(3), name="steady", op=commlib.Sum), np.full(3, float(n)), "late")
    done()
else:
    fail(f"unknown mode {mode}")

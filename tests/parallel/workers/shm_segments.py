"""Each rank reports the bytes of commlib's shared segments it maps (from
/proc/self/maps: "/memfd:commlib (deleted)", none named in /dev/shm), after
an allreduce and a point-to-point exchange through them worked."""
import numpy as np

import commlib
from _common import check_equal, fail
from shm_kinds import segments

commlib.init()
r, n = commlib.rank(), commlib.size()
x = np.arange(100000, dtype=np.float32) + r
check_equal(commlib.allreduce(x, op=commlib.Sum), np.arange(100000, dtype=np.float32) * n + n * (n - 1) / 2,
            "allreduce")
peer = (r + 1) % n
got = commlib.sendrecv(np.full(10, r, np.int64), peer, (r - 1) % n)
check_equal(got, np.full(10, (r - 1) % n, np.int64), "sendrecv")
kinds = segments()
if set(kinds) != {"unnamed"}:
    fail(f"segments without a name only: {kinds}")
print(f"rank {r}: segment bytes {kinds['unnamed']}", flush=True)
commlib.shutdown()
print(f"rank {r}: OK", flush=True)

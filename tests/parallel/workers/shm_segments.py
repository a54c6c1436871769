"""Each rank reports the bytes of commlib's shared segments it maps (from
/proc/self/maps: "/dev/shm/commlib.* (deleted)"), after an allreduce and a
point-to-point exchange through them worked."""
import numpy as np

import commlib
from _common import check_equal


def segment_bytes() -> int:
    total = 0
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/commlib."):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                total += end - start
    return total


commlib.init()
r, n = commlib.rank(), commlib.size()
x = np.arange(100000, dtype=np.float32) + r
check_equal(commlib.allreduce(x, op=commlib.Sum), np.arange(100000, dtype=np.float32) * n + n * (n - 1) / 2,
            "allreduce")
peer = (r + 1) % n
got = commlib.sendrecv(np.full(10, r, np.int64), peer, (r - 1) % n)
check_equal(got, np.full(10, (r - 1) % n, np.int64), "sendrecv")
print(f"rank {r}: segment bytes {segment_bytes()}", flush=True)
commlib.shutdown()
print(f"rank {r}: OK", flush=True)

"""The kind of shared segments a host agrees on, and the collectives and
point-to-point through them against numpy.

Usage: shm_fallback.py unnamed|named-all|named-last (named-last: only the
host's last rank sets the testing-only COMMLIB_TEST_SHM_NAMED=1, refusing the
unnamed segment that local rank 0 made, so that every rank falls back)."""
import os
import sys

import numpy as np

import commlib
from commlib.launch._rankwrap import get_rank
from _common import check_equal, fail
from shm_kinds import segments

mode = sys.argv[1]
# (before init: the launcher's variables, MPICH's or Open MPI's)
size = os.environ.get("PMI_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE")
if mode == "named-last" and int(get_rank()) == int(size) - 1:
    os.environ["COMMLIB_TEST_SHM_NAMED"] = "1"
commlib.init()
r, n = commlib.rank(), commlib.size()
want_kind = "unnamed" if mode == "unnamed" else "named"
kinds = segments()
if set(kinds) != {want_kind}:
    fail(f"{mode}: segments of kind {want_kind} only, got {kinds}")

# Small (fused, through the fusion regions) and large (through the segment's pieces).
for count in (7, 600_001):
    for dt in (np.float64, np.int32):
        ins = [(np.arange(count) % 1000 + q).astype(dt) for q in range(n)]
        check_equal(commlib.allreduce(ins[r], op=commlib.Sum), np.sum(ins, axis=0, dtype=dt),
                    f"allreduce {count} {dt.__name__}")
        check_equal(commlib.allreduce(ins[r], op=commlib.Max), np.max(ins, axis=0), f"allreduce max {count}")
        rows = [(np.arange((q + 1) * count, dtype=np.int64) * (q + 1)).astype(dt) for q in range(n)]
        check_equal(commlib.allgather(rows[r]), np.concatenate(rows), f"allgather {count} {dt.__name__}")
        for root in range(n):
            x = (np.arange(count) * (root + 2)).astype(dt) if r == root else np.zeros(count, dt)
            check_equal(commlib.broadcast(x, root_rank=root), (np.arange(count) * (root + 2)).astype(dt),
                        f"broadcast {count} {dt.__name__} root {root}")
got = commlib.sendrecv(np.full(10, r, np.int64), (r + 1) % n, (r - 1) % n)
check_equal(got, np.full(10, (r - 1) % n, np.int64), "sendrecv")
commlib.shutdown()
print(f"rank {r}: OK", flush=True)

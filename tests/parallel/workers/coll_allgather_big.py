"""Run by tests/parallel/test_large_collectives.py at 2 ranks: an allgather of
more than 2^31-1 bytes per rank (4 GiB in all), each rank's part already in
place in `out` (nothing else allocated). Every rank fills its part with its
own pattern (a random block of a prime length, repeated) and checks the whole
result at a million random positions and around every 1 GiB boundary of each
part (where MPI pieces meet)."""
import time

import numpy as np

import commlib
from _common import done, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
if n != 2:
    fail("run me at 2 ranks")
PERIOD = 1_000_003
SIZES = [2 ** 31 + 4099, 2 ** 31 + 17]
STARTS = [0, SIZES[0]]


def block(q):
    return np.random.default_rng(q + 1).integers(0, 256, PERIOD, dtype=np.uint8)


def fill(part, blk):
    k = part.size // PERIOD
    part[:k * PERIOD].reshape(k, PERIOD)[:] = blk
    part[k * PERIOD:] = blk[:part.size - k * PERIOD]


out = np.empty(sum(SIZES), np.uint8)
mine = out[STARTS[r]:STARTS[r] + SIZES[r]]
fill(mine, block(r))
commlib.barrier()
t0 = time.perf_counter()
got = commlib.allgather(mine, name="big", out=out)
took = time.perf_counter() - t0
if got.shape != out.shape or not np.shares_memory(got, out):
    fail(f"the result is not `out`: shape {got.shape}")
rng = np.random.default_rng(7 + r)
for q in range(n):
    part, blk = out[STARTS[q]:STARTS[q] + SIZES[q]], block(q)
    edges = [np.arange(max(0, m - 4096), min(SIZES[q], m + 4096)) for m in range(0, SIZES[q] + 1, 2 ** 30)]
    idx = np.concatenate([rng.integers(0, SIZES[q], 1_000_000), *edges, np.arange(SIZES[q] - 4096, SIZES[q])])
    bad = np.flatnonzero(part[idx] != blk[idx % PERIOD])
    if bad.size:
        fail(f"rank {q}'s part differs at {bad.size} of {idx.size} checked positions, first at byte {idx[bad[0]]}")
print(f"rank {r}: allgather of {SIZES[r]} bytes per rank ({out.nbytes / 2**30:.2f} GiB in all): {took:.2f} s",
      flush=True)
done()
commlib.shutdown()

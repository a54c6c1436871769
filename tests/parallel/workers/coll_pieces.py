"""Run by tests/parallel/test_large_collectives.py with COMMLIB_TEST_MPI_CALL_BYTES
lowered to a few hundred bytes: allgather, alltoall and reducescatter (single
and fused, several in flight) much larger than one MPI call, with uneven
first dimensions, then allreduce and broadcast, checked against numpy on
every rank. argv[1]: the timeline
path; argv[2]: "mpi" when the collectives go through MPI (the timeline must
then show them in pieces, `mpi-pieces`), "shm" when through shared memory.

Inputs are small integers, so every sum is exact and results must be equal.
"""
import os
import sys
import zlib

import numpy as np

import commlib
from _common import check_equal, done, fail
from commlib.timeline import load_events, rank_file

path, route = sys.argv[1], sys.argv[2]
commlib.init()
r, n = commlib.rank(), commlib.size()
commlib.start_timeline(path)
LIMIT = int(os.environ["COMMLIB_TEST_MPI_CALL_BYTES"])


def data(tag, rank, shape, dtype):
    g = np.random.default_rng(zlib.crc32(repr((tag, rank, shape)).encode()))
    return g.integers(0, 9, size=shape).astype(dtype)


def gather_rows(j, rank):
    return 40 + 7 * rank + 3 * j  # uneven: every rank has its own dimension 0


# ---------------------------------------------------------------- allgather
for j, (dt, trail) in enumerate([(np.float64, (3,)), (np.uint8, (5, 2)), (np.int32, (2,))]):
    parts = [data(f"g{j}", q, (gather_rows(j, q),) + trail, dt) for q in range(n)]
    want = np.concatenate(parts)
    if want.nbytes <= 2 * LIMIT:
        fail(f"allgather {j}: {want.nbytes} bytes do not exceed one call")
    check_equal(commlib.allgather(parts[r], name=f"gather.{j}"), want, f"allgather {j}")
    # in place: this rank's part already sits in `out`
    out = np.zeros_like(want)
    first = sum(p.shape[0] for p in parts[:r])
    out[first:first + parts[r].shape[0]] = parts[r]
    commlib.allgather(out[first:first + parts[r].shape[0]], name=f"gather.inplace.{j}", out=out)
    check_equal(out, want, f"allgather in place {j}")

# several in flight: fused into one allgather
gather_ins = [data(f"f{j}", r, (gather_rows(j, r), 4), np.float32) for j in range(5)]
handles = [commlib.allgather_async(x, name=f"fused.{j}") for j, x in enumerate(gather_ins)]
for j, h in enumerate(handles):
    want = np.concatenate([data(f"f{j}", q, (gather_rows(j, q), 4), np.float32) for q in range(n)])
    check_equal(commlib.synchronize(h), want, f"fused allgather {j}")

# ---------------------------------------------------------------- alltoall
k = 30  # equal parts: 30 rows of 8 float64 to every rank
ins = [data("a2a", q, (n * k, 8), np.float64) for q in range(n)]
check_equal(commlib.alltoall(ins[r], name="a2a.equal"), np.concatenate([x[r * k:(r + 1) * k] for x in ins]),
            "alltoall equal splits")


def splits_of(q):  # uneven, a zero among them
    return [0 if (q + i) % 3 == 2 else 20 + 9 * q + 5 * i for i in range(n)]


ins = [data("a2av", q, (sum(splits_of(q)), 6), np.int64) for q in range(n)]
got, received = commlib.alltoall(ins[r], splits=splits_of(r), name="a2a.uneven")
want = []
for q in range(n):
    s = splits_of(q)
    want.append(ins[q][sum(s[:r]):sum(s[:r + 1])])
check_equal(got, np.concatenate(want), "alltoall uneven splits")
check_equal(np.asarray(received), np.array([splits_of(q)[r] for q in range(n)]), "alltoall received splits")


# ---------------------------------------------------------------- reducescatter
def own_rows(dim0, splits=None):
    rows = splits or [dim0 // n + (1 if q < dim0 % n else 0) for q in range(n)]
    return sum(rows[:r]), rows[r]


RS = [  # (dtype, op, dim0, splits, pieces (no splits then)): the first three in flight together (fused), then the others
    (np.float32, commlib.Sum, 10 * n + 1, None, False),
    (np.float32, commlib.Sum, None, [25 + 11 * q for q in range(n)], False),
    (np.float32, commlib.Sum, 11 * n + 2, None, True),
    (np.int32, commlib.Sum, 10 * n + 1, None, False),
    (np.float32, commlib.Average, 12 * n + 2, None, False),
    (np.float16, commlib.Sum, 40 * n + 1, None, False),
    (np.float64, commlib.Max, 13 * n + 2, None, True),
]


def rs_inputs(j, rank):
    dt, _, dim0, splits, pieces = RS[j]
    x = data(f"rs{j}", rank, (dim0 or sum(splits), 7), dt)
    if pieces:
        x[2:4] = 0
    return x


def rs_submit(j):
    dt, op, _, splits, pieces = RS[j]
    x = rs_inputs(j, r)
    if pieces:  # rows 2-3 are zeros, passed as a count
        flat = x.reshape(-1)
        return commlib.reducescatter_pieces_async([flat[:14].copy(), 14, flat[28:].copy()], x.shape, dt, op=op,
                                                  name=f"rs.{j}")
    return commlib.reducescatter_async(x, op=op, splits=splits, name=f"rs.{j}")


handles = [rs_submit(j) for j in range(3)]
results = [commlib.synchronize(h) for h in handles]
results += [commlib.synchronize(rs_submit(j)) for j in range(3, len(RS))]
for j, (dt, op, dim0, splits, pieces) in enumerate(RS):
    ins = [rs_inputs(j, q).astype(np.float64) for q in range(n)]
    full = np.max(ins, axis=0) if op == commlib.Max else np.sum(ins, axis=0) / (n if op == commlib.Average else 1)
    if full.size * np.dtype(dt).itemsize <= 2 * LIMIT:
        fail(f"reducescatter {j}: {full.size * np.dtype(dt).itemsize} bytes do not exceed one call")
    first, rows = own_rows(full.shape[0], splits)
    check_equal(results[j], full[first:first + rows].astype(dt), f"reducescatter {j}",
                rtol=1e-6 if op == commlib.Average else 0.0)

# ---------------------------------------------------------------- allreduce, broadcast (pieces too)
for count in (500, 9000):  # the tree and the ring across hosts (point-to-point in pieces)
    want = np.sum([data("ar", q, (count,), np.float64) for q in range(n)], axis=0)
    check_equal(commlib.allreduce(data("ar", r, (count,), np.float64), op=commlib.Sum, name=f"ar.{count}"),
                want, f"allreduce of {count}")
x = data("bc", 1, (777, 3), np.int64) if r == 1 else np.zeros((777, 3), np.int64)
check_equal(commlib.broadcast(x, 1, name="bc"), data("bc", 1, (777, 3), np.int64), "broadcast")

commlib.barrier()
commlib.stop_timeline()

# ---------------------------------------------------------------- the route taken
events = load_events(rank_file(path, r))
algos, fused = {}, set()
for e in events:
    args = e.get("args") or {}
    if args.get("algorithm"):
        algos.setdefault(e["name"].lower(), set()).add(args["algorithm"])
    if args.get("fused_count", 1) > 1:
        fused.add(e["name"].lower())
for op in ("allgather", "alltoall", "reducescatter"):
    seen = set().union(*[a for name, a in algos.items() if op in name] or [set()])
    if route == "mpi" and "mpi-pieces" not in seen:
        fail(f"{op} never went through MPI in pieces: {sorted(seen)}")
    if route == "shm" and seen != {"shm"}:
        fail(f"{op} did not go through shared memory: {sorted(seen)}")
print(f"rank {r}: algorithms {dict(sorted((k, sorted(v)) for k, v in algos.items()))}, fused {sorted(fused)}",
      flush=True)
for op in ("allgather", "reducescatter"):
    if not any(op in name for name in fused):
        fail(f"no fused {op} in the timeline (fused: {sorted(fused)})")
done()
commlib.shutdown()

"""Repeated named calls on one array (commlib.submit.repeat: the request of
an identical call submitted again, with a new output where the result is a
new array) must give what a first call gives: out-of-place allreduce (also into a given out),
allgather (also into a given out, and another out under the same name), both broadcasts, alltoall (even and uneven splits),
reducescatter (also into a given out), with the data changed in place between calls and the
arguments changed under the same name (op, root, splits, scale factors, the
process set). Small broadcasts of two roots in flight together (fused per
root; a large one alone). Then, with the routes the timeline shows
checked (argv[1]: the expected ones, "a2a=R,ag=R,bc=R"; R "shm" the
regions, "shm-direct" single copies, "shm-split" one copy split between
two ranks, "mpi"), a large alltoall with uneven splits and a zero block
(over 16 MiB sent by a rank), large broadcasts from every root (5.6 MB
through the root's region, or split where the 68 MB one is; the route given
for 68 MB), the root overwriting its buffer at once, and a large uneven
allgather (a 70 MB result).
Every result is checked against numpy on every rank."""
import sys

import numpy as np

import commlib
from _common import check_equal, done, fail
from commlib.timeline import load_events, rank_file

routes, path = dict(kv.split("=") for kv in sys.argv[1].split(",")), sys.argv[2]
commlib.init()
r, n = commlib.rank(), commlib.size()
commlib.start_timeline(path)
x = np.zeros((2 * n, 3), np.float64)
rs_out = np.empty((2, 3), np.float64)
ag_out = np.empty((2 * n * n, 3), np.float64)
ar_out = np.empty_like(x)


def contribution(q, k):
    return np.arange(x.size, dtype=np.float64).reshape(x.shape) * (q + 1) + 10 * k


def ops_of(k):
    x[:] = contribution(r, k)  # (in place: the same array every time)
    every = [contribution(q, k) for q in range(n)]
    op = (commlib.Sum, commlib.Max)[k % 2]
    want = np.sum(every, axis=0) if op == commlib.Sum else np.max(every, axis=0)
    check_equal(commlib.allreduce(x, op=op, name="ar"), want, f"allreduce {k}")
    check_equal(commlib.allreduce(x, op=commlib.Sum, prescale_factor=k + 1.0, name="ar.scaled"),
                np.sum(every, axis=0) * (k + 1), f"scaled allreduce {k}")
    got = commlib.allreduce(x, op=op, name="ar.out", out=ar_out)  # (the same out every time)
    if got is not ar_out:
        fail("allreduce with out= must return out")
    check_equal(ar_out, want, f"allreduce into out {k}")
    other = np.full_like(ar_out, -1)  # (another out under the same name: written, the first left alone)
    ar_out[:] = -1
    check_equal(commlib.allreduce(x, op=op, name="ar.out", out=other), want, f"allreduce into another out {k}")
    check_equal(ar_out, np.full_like(ar_out, -1), f"allreduce's first out after another's call {k}")
    check_equal(commlib.synchronize(commlib.allreduce_async(x, op=op, name="ar.out", out=ar_out)), want,
                f"allreduce_async into out {k}")
    check_equal(commlib.allgather(x, name="ag"), np.concatenate(every), f"allgather {k}")
    got = commlib.allgather(x, name="ag.out", out=ag_out)  # (the same out every time)
    if got is not ag_out:
        fail("allgather with out= must return out")
    check_equal(ag_out, np.concatenate(every), f"allgather into out {k}")
    other = np.empty_like(ag_out)  # (another out under the same name: written, the first left alone)
    ag_out[:] = -1
    check_equal(commlib.allgather(x, name="ag.out", out=other), np.concatenate(every),
                f"allgather into another out {k}")
    check_equal(ag_out, np.full_like(ag_out, -1), f"allgather's first out after another's call {k}")
    root = k % n
    check_equal(commlib.broadcast(x, root, name="bc"), every[root], f"broadcast {k}")
    y = x.copy()
    check_equal(commlib.broadcast_(y, root, name="bc_"), every[root], f"broadcast_ {k}")
    check_equal(commlib.alltoall(x, name="a2a"), np.concatenate([e[2 * r:2 * r + 2] for e in every]),
                f"alltoall {k}")
    splits = [(q + k) % 3 for q in range(n)]  # the same on every rank here; changes with k
    splits[-1] = 2 * n - sum(splits[:-1])
    got, received = commlib.alltoall(x, splits=splits, name="a2a.uneven")
    lo = sum(splits[:r])
    check_equal(got, np.concatenate([e[lo:lo + splits[r]] for e in every]), f"uneven alltoall {k}")
    check_equal(received, np.array([splits[r]] * n), f"uneven alltoall splits {k}")
    check_equal(commlib.reducescatter(x, op=commlib.Sum, name="rs"), np.sum(every, axis=0)[2 * r:2 * r + 2],
                f"reducescatter {k}")
    got = commlib.reducescatter(x, op=commlib.Sum, name="rs.out", out=rs_out)  # (the same out every time)
    if got is not rs_out:
        fail("reducescatter with out= must return out")
    check_equal(rs_out, np.sum(every, axis=0)[2 * r:2 * r + 2], f"reducescatter into out {k}")
    rs_splits = splits
    check_equal(commlib.reducescatter(x, op=commlib.Sum, splits=rs_splits, name="rs.splits"),
                np.sum(every, axis=0)[lo:lo + rs_splits[r]], f"reducescatter with splits {k}")


for k in range(4):
    ops_of(k)
if n >= 3:  # the same names on a process set: its own requests
    ps = commlib.add_process_set([0, 1])
    if r in (0, 1):
        x[:] = contribution(r, 7)
        check_equal(commlib.allgather(x, name="ag", process_set=ps),
                    np.concatenate([contribution(q, 7) for q in (0, 1)]), "allgather on a set")
        check_equal(commlib.broadcast(x, 1, name="bc", process_set=ps), contribution(1, 7), "broadcast on a set")
    commlib.remove_process_set(ps)
ops_of(4)


# Small broadcasts in flight together, two roots, mixed dtypes (fused per
# root on the host), one too large to fuse, an empty one; twice.
kinds = [(np.float32, (5, 3)), (np.int64, (7,)), (np.uint8, (33,)), (np.float64, (2, 2)), (np.int32, (0,)),
         (np.float32, (40000,))]
for rnd in range(2):
    bufs, want = [], []
    for i, (dt, shape) in enumerate(kinds + kinds):
        root = 0 if i < len(kinds) else n - 1
        value = lambda q: (np.arange(int(np.prod(shape))).reshape(shape) % 100 + 7 * q + i + rnd).astype(dt)
        bufs.append((value(r), root))
        want.append(value(root))
    hs = [commlib.broadcast_async_(b, root, name=f"small.bc.{i}") for i, (b, root) in enumerate(bufs)]
    for i, h in enumerate(hs):
        check_equal(commlib.synchronize(h), want[i], f"small broadcast {i} (round {rnd})")


def big(q):  # rows rank q sends to each rank: uneven; rank 1 keeps none, the last sends rank 0 none at 3
    return [0 if (q, d) in ((1, 1), (n - 1, 0) if n > 2 else (1, 1)) else 300000 + 7000 * q + 3000 * d
            for d in range(n)]  # (9.6-9.9 MB blocks: over 16 MiB sent by a rank at 2 ranks)


ins = [np.arange(sum(big(q)) * 8, dtype=np.float32).reshape(-1, 8) + 1e5 * q for q in range(n)]
for _ in range(2):
    got, received = commlib.alltoall(ins[r], splits=big(r), name="a2a.big")
    want = [ins[q][sum(big(q)[:r]):sum(big(q)[:r + 1])] for q in range(n)]
    check_equal(got, np.concatenate(want), "large uneven alltoall")
    check_equal(received, np.array([big(q)[r] for q in range(n)]), "large alltoall splits")
# Large broadcasts from every root, in place and out of place (through the
# root's region; where the kernel lets ranks read each other, at 2 ranks the
# receiver reads half the root's buffer and the root writes the other half,
# from 64 MiB at more ranks each rank reads the root's buffer itself): the
# root overwrites its buffer as soon as the call returns, so a rank still
# reading it would see the new values, and a receiver checks its buffer as
# soon as its call returns, so a root still writing would leave it short.
for root in range(n):
    # (320 KB, 5.6 MB, 68 MB of float32; just over 64 KiB and 4 MB, halves not a whole page)
    for elems in (80_000, 1_400_000, 17_000_000, 16_411, 1_000_003):
        want = np.arange(elems, dtype=np.float32) * (root + 1)
        y = want.copy() if r == root else np.full(elems, -1.0, np.float32)
        commlib.broadcast_(y, root, name="bc.big_")
        if r == root:
            y[:] = 0
        else:
            check_equal(y, want, f"large broadcast_ of {elems} from {root}")
        z = want.copy() if r == root else np.zeros(elems, np.float32)
        got = commlib.broadcast(z, root, name="bc.big")
        z[:] = 3
        check_equal(got, want, f"large broadcast of {elems} from {root}")
# A large allgather (a 70 MB result: from 64 MiB at 2 ranks each rank reads
# the others' inputs itself), uneven, one rank contributing none, every
# input overwritten as soon as the call returns.
ag_rows = lambda q: 0 if q == 1 else 8_750_000 // (n - 1) + 10_000 * q  # noqa: E731
for _ in range(2):
    mine = np.arange(ag_rows(r) * 2, dtype=np.float32).reshape(-1, 2) + 0.5 * r
    got = commlib.allgather(mine, name="ag.big")
    mine[:] = -1
    check_equal(got, np.concatenate([np.arange(ag_rows(q) * 2, dtype=np.float32).reshape(-1, 2) + 0.5 * q
                                     for q in range(n)]), "large allgather")
commlib.barrier()
commlib.stop_timeline()
events = load_events(rank_file(path, r))
seen = {e["args"]["algorithm"] for e in events
        if e["name"] == "alltoall" and "a2a.big" in e.get("args", {}).get("fused_with", ())}
if seen != {routes["a2a"]}:
    fail(f"the large alltoall went {sorted(seen)}, not {routes['a2a']}")
def broadcast_routes(low, high):
    return {e["args"]["algorithm"] for e in events
            if e["name"] == "broadcast" and "bc.big_" in e.get("args", {}).get("fused_with", ())
            and low < e["args"].get("bytes", 0) < high}


# (2 ranks: the copy split between the two from 64 KiB; more: the root's region up to 64 MiB)
mid = "shm-split" if routes["bc"] == "shm-split" else "shm"
seen = broadcast_routes(4 << 20, 64 << 20)
if seen != {mid}:
    fail(f"the 5.6 MB broadcasts went {sorted(seen)}, not {mid}")
seen = broadcast_routes(64 << 20, 1 << 40)
if seen != {routes["bc"]}:
    fail(f"the 68 MB broadcasts went {sorted(seen)}, not {routes['bc']}")
seen = {e["args"]["algorithm"] for e in events
        if e["name"] == "allgather" and "ag.big" in e.get("args", {}).get("fused_with", ())}
if seen != {routes["ag"]}:
    fail(f"the large allgather went {sorted(seen)}, not {routes['ag']}")
fused = max((e["args"].get("fused_count", 1) for e in events
             if e["name"] == "broadcast" and "small.bc.0" in e.get("args", {}).get("fused_with", ())), default=0)
if fused < 2:
    fail(f"the small broadcasts in flight together were not fused (fused_count {fused})")
big_bc = [e["args"].get("fused_count") for e in events
          if e["name"] == "broadcast" and "small.bc.5" in e.get("args", {}).get("fused_with", ())]
if big_bc and max(big_bc) != 1:
    fail(f"a broadcast of 160 KB was fused ({big_bc})")
done()
commlib.shutdown()

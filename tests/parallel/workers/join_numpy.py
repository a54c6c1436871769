"""join(): ranks with uneven amounts of work. Rank r runs r + 1 steps of
every collective (named, so that the response cache holds them from the
second step on) and then joins; the ranks still running get results in
which the joined ranks contributed zeros / no rows, checked against numpy
on every rank. Then: join's return value, generated names after a join,
grouped allreduce, reducescatter, alltoall, barrier, a process set, and a
joined broadcast root (an error on the ranks that asked)."""
import sys

import numpy as np

import commlib
from _common import check_equal, done, expect_raises

commlib.init()
r, n = commlib.rank(), commlib.size()


def live(step):
    """The ranks still running at this step (rank q runs q + 1 steps)."""
    return [q for q in range(n) if q + 1 > step]


def value(q, step):
    return np.arange(6, dtype=np.float32).reshape(3, 2) * (q + 1) + step


def uneven_epoch(epoch):
    for step in range(r + 1):
        ranks = live(step)
        tag = f"e{epoch}.s{step}" if step else f"e{epoch}"  # step 0 once, the rest repeat names
        got = commlib.allreduce(value(r, step), name=f"sum.{step % 2}", op=commlib.Sum)
        check_equal(got, sum(value(q, step) for q in ranks), f"{tag} allreduce Sum")
        got = commlib.allreduce(value(r, step), name=f"avg.{step % 2}", op=commlib.Average)
        check_equal(got, sum(value(q, step) for q in ranks) / n, f"{tag} allreduce Average", rtol=1e-6)
        xs = [np.full(5, q + step, np.int64) for q in (r, r + 1)]
        got = commlib.grouped_allreduce(xs, name=f"grp.{step % 2}", op=commlib.Sum)
        for k, g in enumerate(got):
            check_equal(g, np.full(5, sum(q + k + step for q in ranks), np.int64), f"{tag} grouped {k}")
        got = commlib.allgather(np.full((r + 1, 2), r, np.int16), name=f"ag.{step % 2}")
        want = np.concatenate([np.full((q + 1, 2), q, np.int16) for q in ranks])
        check_equal(got, want, f"{tag} allgather")
        root = n - 1  # (the last rank to join)
        got = commlib.broadcast(np.full(4, float(r + step)), root_rank=root, name=f"bc.{step % 2}")
        check_equal(got, np.full(4, float(root + step)), f"{tag} broadcast")
        rows = np.arange(2 * n, dtype=np.float64).reshape(n * 2, 1) * (r + 1)
        got = commlib.reducescatter(rows, op=commlib.Sum, name=f"rs.{step % 2}")
        full = sum(np.arange(2 * n, dtype=np.float64).reshape(n * 2, 1) * (q + 1) for q in ranks)
        check_equal(got, full[2 * r:2 * r + 2], f"{tag} reducescatter")
        send = np.full((n, 3), r, np.int32)
        got, splits = commlib.alltoall(send, splits=[1] * n, name=f"a2a.{step % 2}")
        check_equal(got, np.array([[q] * 3 for q in ranks], np.int32), f"{tag} alltoall")
        check_equal(splits, np.array([1 if q in ranks else 0 for q in range(n)]), f"{tag} alltoall splits")
        commlib.barrier()
    return commlib.join()


for epoch in range(2):
    last = uneven_epoch(epoch)
    check_equal(np.array(last), np.array(n - 1), f"epoch {epoch}: join returned")

# Generated names are the same on every rank after a join, although the
# joined ranks skipped some of the others' unnamed calls before it.
if r != 0:
    commlib.allreduce(np.ones(2), op=commlib.Sum)
last = commlib.join()
if n > 1 and last == 0:
    print(f"rank {r}: FAILED: rank 0 joined first but join() returned 0", file=sys.stderr)
    sys.exit(1)
everyone = commlib.allgather(np.array([last]), name="lasts")
check_equal(everyone, np.full(n, last), "join() returns the same rank everywhere")
got = commlib.allreduce(np.ones(2), op=commlib.Sum)
check_equal(got, np.full(2, float(n)), "unnamed allreduce after joins")

# A process set: its joined member contributes zeros there too.
if n >= 3:
    ps = commlib.add_process_set([1, 2])
    if r == 2:
        got = commlib.allreduce(np.full(3, 5.0), op=commlib.Sum, name="ps.sum", process_set=ps)
        check_equal(got, np.full(3, 5.0), "process set allreduce with rank 1 joined")
    commlib.join()
    commlib.remove_process_set(ps)

# A joined rank cannot be a broadcast's root: the others' broadcast fails.
if r == 0:
    commlib.join()
else:
    expect_raises(ValueError, lambda: commlib.broadcast(np.zeros(2), root_rank=0, name="from.joined"),
                  "broadcast from a joined root", match="rank 0 has called join()")
    commlib.join()

# Still consistent afterwards, and the response cache serves again (it
# pauses while some ranks have joined).
hits = commlib.response_cache_stats()["hits"]
for step in range(5):
    got = commlib.allreduce(np.full(2, float(r)), name="after", op=commlib.Sum)
    check_equal(got, np.full(2, float(sum(range(n)))), f"after step {step}")
stats = commlib.response_cache_stats()
if len(sys.argv) > 1 and sys.argv[1] == "cache" and stats["hits"] <= hits:
    print(f"rank {r}: FAILED: the response cache did not serve after the joins: {stats}", file=sys.stderr)
    sys.exit(1)
commlib.shutdown()
print(f"rank {r}: OK", flush=True)

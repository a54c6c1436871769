"""Process sets through the numpy API, every rank checking against numpy.

Static sets (init(process_sets=[even, odd])): every collective on the set
each rank belongs to, both sets at once (disjoint sets run concurrently;
with 3 ranks odd = [1] is a single-rank set, with 2 ranks both are), async
ops on a set and on the global set interleaved, unnamed ops whose per-set
counters must not disturb the global ones, objects. Errors: non-members,
roots outside the set, unregistered/wrong-type sets, duplicates, removing
the global set, ranks outside the job, mismatched add lists (on every rank).
Dynamic sets: added (one from an mpi4py communicator) and removed twice.
"""
import numpy as np
from mpi4py import MPI

import commlib
from commlib import objects
from _common import check_equal, done, expect_raises, fail

N = MPI.COMM_WORLD.Get_size()
even = commlib.ProcessSet(list(range(0, N, 2)))
odd = commlib.ProcessSet(list(range(1, N, 2)))
commlib.init(process_sets=[even, odd])
r, n = commlib.rank(), commlib.size()
assert n == N


def data(k, shape=(2, 3), dtype=np.float64):
    """Rank k's deterministic input (exact in every dtype used)."""
    return (np.arange(int(np.prod(shape))).reshape(shape) * (k + 1) + k).astype(dtype)


def rows_of(dim0, m, pos):
    return dim0 // m + (1 if pos < dim0 % m else 0)


def check_ops(ps, tag):
    """Every collective on ``ps`` (this rank is a member) against numpy."""
    ranks = ps.ranks
    m, pos = len(ranks), ranks.index(r)
    if ps.size() != m or ps.rank() != pos or not ps.included():
        fail(f"{tag}: size/rank/included {ps.size()}/{ps.rank()}/{ps.included()} for {ranks}")
    X = {k: data(k) for k in ranks}
    stack = np.stack([X[k] for k in ranks])

    # allreduce: every op; Average divides by the set's size
    check_equal(commlib.allreduce(X[r], op=commlib.Sum, process_set=ps), stack.sum(0),
                f"{tag} allreduce Sum")
    check_equal(commlib.allreduce(X[r], process_set=ps), stack.sum(0) / m,
                f"{tag} allreduce Average", rtol=1e-12)
    check_equal(commlib.allreduce(X[r], op=commlib.Min, process_set=ps), stack.min(0),
                f"{tag} allreduce Min")
    check_equal(commlib.allreduce(X[r], op=commlib.Max, process_set=ps), stack.max(0),
                f"{tag} allreduce Max")
    check_equal(commlib.allreduce(X[r].astype(np.int32), op=commlib.Sum, process_set=ps),
                stack.sum(0).astype(np.int32), f"{tag} allreduce int32 Sum")
    check_equal(commlib.allreduce(X[r], op=commlib.Sum, prescale_factor=2.0,
                                  postscale_factor=0.25, process_set=ps),
                stack.sum(0) * 0.5, f"{tag} allreduce scaled", rtol=1e-12)
    inplace = X[r].copy()
    commlib.allreduce_(inplace, op=commlib.Sum, process_set=ps)
    check_equal(inplace, stack.sum(0), f"{tag} allreduce_")
    outs = commlib.grouped_allreduce([X[r], X[r][0].astype(np.float32)], process_set=ps)
    check_equal(outs[0], stack.mean(0), f"{tag} grouped_allreduce[0]", rtol=1e-12)
    check_equal(outs[1], stack.mean(0)[0].astype(np.float32), f"{tag} grouped_allreduce[1]",
                rtol=1e-6)
    bufs = [X[r].copy(), X[r][:, :1].copy()]
    commlib.grouped_allreduce_(bufs, op=commlib.Max, process_set=ps)
    check_equal(bufs[1], stack.max(0)[:, :1], f"{tag} grouped_allreduce_")

    # allgather: dimension 0 differs across members; rows in the set's order
    G = {k: np.arange(2 * (k + 1), dtype=np.float32).reshape(k + 1, 2) + 100 * k for k in ranks}
    check_equal(commlib.allgather(G[r], process_set=ps), np.concatenate([G[k] for k in ranks]),
                f"{tag} allgather")

    # alltoall with splits (one entry per member) and without
    def splits_of(p):
        return [(p + j) % 2 + 1 for j in range(m)]

    def a2a_input(k):
        rows = sum(splits_of(ranks.index(k)))
        return (np.arange(rows, dtype=np.int64) + 1000 * k).reshape(rows, 1)

    def segment(k, j):
        s = splits_of(ranks.index(k))
        return a2a_input(k)[sum(s[:j]):sum(s[:j + 1])]

    out, recv = commlib.alltoall(a2a_input(r), splits=splits_of(pos), process_set=ps)
    check_equal(out, np.concatenate([segment(k, pos) for k in ranks]), f"{tag} alltoall splits")
    check_equal(recv, np.array([splits_of(ranks.index(k))[pos] for k in ranks], np.int64),
                f"{tag} alltoall received splits")
    even_in = np.arange(2 * m, dtype=np.float64) + 10 * r
    check_equal(commlib.alltoall(even_in, process_set=ps),
                np.concatenate([np.arange(2 * m, dtype=np.float64)[2 * pos:2 * pos + 2] + 10 * k
                                for k in ranks]), f"{tag} alltoall even")
    expect_raises(ValueError, lambda: commlib.alltoall(even_in, splits=[2 * m] + [0] * m,
                                                       process_set=ps),
                  f"{tag} alltoall splits with one entry too many", match="one entry per rank")

    # reducescatter: part i on the set's i-th member (uneven dimension 0)
    dim0 = 2 * m + 1
    R = {k: data(k, (dim0, 2)) for k in ranks}
    total = np.stack([R[k] for k in ranks]).sum(0)
    lo = sum(rows_of(dim0, m, q) for q in range(pos))
    part = slice(lo, lo + rows_of(dim0, m, pos))
    check_equal(commlib.reducescatter(R[r], op=commlib.Sum, process_set=ps), total[part],
                f"{tag} reducescatter Sum")
    check_equal(commlib.reducescatter(R[r], process_set=ps), total[part] / m,
                f"{tag} reducescatter Average", rtol=1e-12)

    # broadcast: root_rank is a job rank of the set (the last member: non-zero)
    root = ranks[-1]
    check_equal(commlib.broadcast(X[r], root, process_set=ps), X[root], f"{tag} broadcast")
    buf = X[r].copy()
    commlib.broadcast_(buf, ranks[0], process_set=ps)
    check_equal(buf, X[ranks[0]], f"{tag} broadcast_")
    commlib.barrier(process_set=ps)

    # Python objects
    got = objects.broadcast_object({"root": root, "ranks": ranks} if r == root else None, root,
                                   process_set=ps)
    if got != {"root": root, "ranks": ranks}:
        fail(f"{tag} broadcast_object: {got}")
    got = objects.allgather_object(("rank", r), process_set=ps)
    if got != [("rank", k) for k in ranks]:
        fail(f"{tag} allgather_object: {got}")


def check_non_member(ps, tag):
    """A rank outside ``ps`` is refused before anything is sent."""
    x = np.ones(3)
    for what, fn in [
            ("allreduce", lambda: commlib.allreduce(x, process_set=ps)),
            ("allreduce_", lambda: commlib.allreduce_(x.copy(), process_set=ps)),
            ("grouped_allreduce", lambda: commlib.grouped_allreduce([x], process_set=ps)),
            ("allgather", lambda: commlib.allgather(x, process_set=ps)),
            ("broadcast", lambda: commlib.broadcast(x, ps.ranks[0], process_set=ps)),
            ("alltoall", lambda: commlib.alltoall(np.ones(ps.size()), process_set=ps)),
            ("reducescatter", lambda: commlib.reducescatter(x, process_set=ps)),
            ("barrier", lambda: commlib.barrier(process_set=ps)),
            ("broadcast_object", lambda: objects.broadcast_object(1, ps.ranks[0], process_set=ps)),
            ("allgather_object", lambda: objects.allgather_object(1, process_set=ps))]:
        expect_raises(ValueError, fn, f"{tag}: non-member {what}", match="not a member")


# ------------------------------------------------------------ static sets
if (even.process_set_id, odd.process_set_id) != (1, 2):
    fail(f"static set ids {even.process_set_id}, {odd.process_set_id} (expected 1, 2)")
if commlib.global_process_set.ranks != list(range(n)) or commlib.global_process_set.size() != n:
    fail(f"global process set {commlib.global_process_set}")
mine, other = (even, odd) if r % 2 == 0 else (odd, even)
if not mine.included() or other.included() or other.rank() is not None:
    fail("included()/rank() of the static sets")

check_ops(mine, f"static {mine.ranks}")  # even and odd at the same time
check_non_member(other, f"static {other.ranks}")
root_outside = other.ranks[0]
expect_raises(ValueError, lambda: commlib.broadcast(np.ones(2), root_outside, process_set=mine),
              "root outside the set", match="not a member")
expect_raises(ValueError, lambda: objects.broadcast_object(1, root_outside, process_set=mine),
              "broadcast_object root outside the set")

# unnamed ops: the set's counters move on its members only (a different
# number of ops per set), the global names still agree
for _ in range(mine.process_set_id):
    commlib.allreduce(np.ones(2), process_set=mine)
    objects.allgather_object(r, process_set=mine)
check_equal(commlib.allreduce(np.ones(2), op=commlib.Sum), np.full(2, float(n)),
            "global allreduce after set ops")
if objects.allgather_object(r) != list(range(n)):
    fail("global allgather_object after set ops")

# async ops on the set and on the global set, interleaved, waited in reverse
X = {k: data(k) for k in range(n)}
h1 = commlib.allreduce_async(X[r], op=commlib.Sum, process_set=mine)
h2 = commlib.allreduce_async(X[r], op=commlib.Sum)
h3 = commlib.allgather_async(X[r], process_set=mine)
h4 = commlib.broadcast_async(X[r], mine.ranks[-1], process_set=mine)
check_equal(commlib.synchronize(h4), X[mine.ranks[-1]], "async broadcast on the set")
check_equal(commlib.synchronize(h3), np.concatenate([X[k] for k in mine.ranks]),
            "async allgather on the set")
check_equal(commlib.synchronize(h2), sum(X[k] for k in range(n)), "async global allreduce")
check_equal(commlib.synchronize(h1), sum(X[k] for k in mine.ranks), "async allreduce on the set")

# refusals made identically on every rank
expect_raises(TypeError, lambda: commlib.allreduce(np.ones(2), process_set=[0]), "a list as set")
expect_raises(ValueError,
              lambda: commlib.allreduce(np.ones(2), process_set=commlib.ProcessSet([0])),
              "unregistered set", match="not registered")
expect_raises(ValueError, lambda: commlib.add_process_set(even), "the registered object again")
expect_raises(ValueError, lambda: commlib.add_process_set(list(even.ranks)), "duplicate ranks",
              match="already exists")
expect_raises(ValueError, lambda: commlib.add_process_set(list(range(n))), "the global set's ranks",
              match="already exists")
expect_raises(ValueError, lambda: commlib.add_process_set([0, n]), "a rank outside the job")
expect_raises(ValueError, lambda: commlib.remove_process_set(commlib.global_process_set),
              "removing the global set")
if commlib.remove_process_set(commlib.ProcessSet([0])) is not False:
    fail("removing an unregistered set should return False")
commlib.barrier()

# ------------------------------------------------------------ removal, mismatch
if commlib.remove_process_set(even) is not True or commlib.remove_process_set(odd) is not True:
    fail("remove_process_set of the static sets")
if commlib.remove_process_set(even) is not False:
    fail("removing a removed set should return False")
expect_raises(ValueError, lambda: commlib.allreduce(np.ones(2), process_set=even),
              "collective on a removed set", match="not registered")
err = expect_raises(commlib.CollectiveMismatchError,
                    lambda: commlib.add_process_set([0] if r == 0 else [0, n - 1]),
                    "add_process_set with different lists")
if "add_process_set" not in str(err):
    fail(f"mismatch message: {err}")
check_equal(commlib.allreduce(np.ones(2), op=commlib.Sum), np.full(2, float(n)),
            "global allreduce after the mismatch")

# ------------------------------------------------------------ dynamic sets, twice
comm = MPI.COMM_WORLD.Split(1 if r >= 1 else MPI.UNDEFINED, r)
first_ids = []
for round_ in range(2):
    single = commlib.add_process_set([0])
    if round_ == 0:
        rest = commlib.add_process_set(commlib.ProcessSet(comm))  # from an mpi4py communicator
    else:
        rest = commlib.add_process_set(list(range(1, n)))
    if rest.ranks != list(range(1, n)) or single.ranks != [0]:
        fail(f"dynamic sets {single}, {rest}")
    ids = (single.process_set_id, rest.process_set_id)
    if round_ == 1 and min(ids) <= max(first_ids):
        fail(f"ids of re-added sets {ids} should be new (first round {first_ids})")
    first_ids = ids
    mine = single if r == 0 else rest
    check_ops(mine, f"dynamic round {round_} {mine.ranks}")  # [0] and [1..] concurrently
    check_non_member(rest if r == 0 else single, f"dynamic round {round_}")
    commlib.barrier()
    if not (commlib.remove_process_set(rest) and commlib.remove_process_set(single)):
        fail(f"remove_process_set round {round_}")
    if single.process_set_id is not None or commlib.remove_process_set(single):
        fail(f"a removed set keeps no id and is not removed twice (round {round_})")

# ------------------------------------------------------------ one set object removed and added again
# Named calls that repeat on the set must go to its new id (they were once
# submitted again with the old one: "process set 1 does not exist").
sub = commlib.ProcessSet(list(range(n - 1)))
x, b = np.full(3, float(r + 1)), np.zeros(2)
for round_ in range(2):
    commlib.add_process_set(sub)
    if r < n - 1:
        for k in range(2):  # (the second call repeats the first's request)
            check_equal(commlib.allreduce(x, op=commlib.Sum, name="readded", process_set=sub),
                        np.full(3, (n - 1) * n / 2), f"named allreduce on a set added again ({round_}, {k})")
            b[:] = r + 5 + round_
            check_equal(commlib.broadcast_(b, 0, name="readded.bc", process_set=sub), np.full(2, 5.0 + round_),
                        f"named broadcast_ on a set added again ({round_}, {k})")
    commlib.barrier()
    if commlib.remove_process_set(sub) is not True:
        fail(f"removing the set added again (round {round_})")

# ------------------------------------------------------------ removal while pending
# Rank 0 has a collective pending on the set that its other member has not
# submitted yet: the removal fails on every rank alike (none hangs), and the
# set keeps working.
if n >= 3:  # (on 2 ranks [0, 1] is the global set's ranks)
    pair = commlib.add_process_set([0, n - 1])
    h = None
    if r == 0:
        h = commlib.allreduce_async(np.full(3, 1.0), name="pending", op=commlib.Sum, process_set=pair)
    err = expect_raises(ValueError, lambda: commlib.remove_process_set(pair),
                        "removing a set with a collective pending", match="pending")
    if "'pending'" not in str(err) or pair.process_set_id is None:
        fail(f"removal refused: {err}; the set must stay registered")
    if r == n - 1:
        h = commlib.allreduce_async(np.full(3, 2.0), name="pending", op=commlib.Sum, process_set=pair)
    if h is not None:
        check_equal(commlib.synchronize(h), np.full(3, 3.0), "the pending collective after the refusal")
    if commlib.remove_process_set(pair) is not True:
        fail("removal once nothing is pending")

check_equal(commlib.allreduce(np.ones(2), op=commlib.Sum), np.full(2, float(n)),
            "global allreduce at the end")
done()

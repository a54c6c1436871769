"""The in-place allreduce's short path (a cached array, a plain op, the
global set: commlib.submit.submit_in_place and its cached name bytes) must
treat every argument as the long path does: each op with its scale factors,
names checked (also once cached) and generated alike on every rank, the
errors of bad ops, names and scales, a name in flight, an empty array; a
call repeated word for word (commlib.submit.quick_repeat) still sees every
change of its arguments and of the array (op, scale, reshape, dtype,
read-only); a group's cached layout sees its members' dtypes and shapes
changed in place. Each result is checked against numpy on every rank."""
import numpy as np

import commlib
from _common import check_equal, done, expect_raises, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
base = np.arange(1, 7, dtype=np.float64)
per_rank = [base * (k + 1) for k in range(n)]  # what each rank contributes
a = np.empty(6, np.float64)


def run(name, **kw):
    a[:] = per_rank[r]
    out = commlib.synchronize(commlib.allreduce_async_(a, name=name, **kw))
    if out is not a:
        raise SystemExit(f"rank {r}: synchronize must return the array itself")
    return a


run("warm", op=commlib.Sum)  # the array's facts are cached from here on
refs = {commlib.Sum: np.sum(per_rank, axis=0), commlib.Average: np.mean(per_rank, axis=0),
        commlib.Min: np.min(per_rank, axis=0), commlib.Max: np.max(per_rank, axis=0),
        commlib.Product: np.prod(per_rank, axis=0)}
for op, want in refs.items():
    for rep in range(2):  # the second time with the name's bytes cached
        check_equal(run(f"op.{op}", op=op), want, f"op {op} (repeat {rep})",
                    rtol=1e-12)
check_equal(run("scaled", op=commlib.Sum, prescale_factor=0.5, postscale_factor=3.0),
            refs[commlib.Sum] * 1.5, "prescale and postscale", rtol=1e-12)
check_equal(run("avg.flag", average=True), refs[commlib.Average], "average=True", rtol=1e-12)
check_equal(run("avg.default"), refs[commlib.Average], "the default op", rtol=1e-12)
check_equal(run("global", op=commlib.Sum, process_set=commlib.global_process_set),
            refs[commlib.Sum], "the global process set given")


class Name(str):
    pass


check_equal(run(Name("subclassed"), op=commlib.Max), refs[commlib.Max], "a str subclass as name")
check_equal(run(None, op=commlib.Sum), refs[commlib.Sum], "a generated name")
check_equal(run(None, op=commlib.Sum), refs[commlib.Sum], "the next generated name")

# errors, before anything is sent (the same on every rank)
expect_raises(ValueError, lambda: commlib.allreduce_async_(a, name="x\x00" + str(r), op=commlib.Sum),
              "a name with a NUL", match="NUL")
expect_raises(ValueError, lambda: commlib.allreduce_async_(a, name="", op=commlib.Sum),
              "an empty name", match="non-empty")
expect_raises(ValueError, lambda: commlib.allreduce_async_(a, name=7, op=commlib.Sum),
              "a name that is no str", match="non-empty string")
expect_raises(ValueError, lambda: commlib.allreduce_async_(a, name="badop", op=True),
              "a bool as op", match="unsupported reduction op")
expect_raises(ValueError, lambda: commlib.allreduce_async_(a, name="badop", op=17),
              "an unknown op", match="unsupported reduction op")
ai = np.ones(6, np.int32)
commlib.allreduce_(ai, name="ai.sum", op=commlib.Sum)  # (checked once: the fast path from now on)
expect_raises(TypeError, lambda: commlib.allreduce_async_(ai, name="ada", op=commlib.Adasum),
              "Adasum of int32 on the fast path", match="Adasum")
expect_raises(ValueError, lambda: commlib.allreduce_async_(a, name="both", op=commlib.Sum, average=True),
              "op and average", match="not both")
expect_raises(ValueError, lambda: commlib.allreduce_async_(a, name="nan", op=commlib.Sum,
                                                           prescale_factor=float("nan")),
              "a NaN scale", match="finite")
a[:] = per_rank[r]
# The last rank submits 'dup' only after the others have tried it twice, so
# their first one is surely still in flight (negotiation waits for it).
if r != n - 1:
    h = commlib.allreduce_async_(a, name="dup", op=commlib.Sum)
    expect_raises(ValueError, lambda: commlib.allreduce_async_(a, name="dup", op=commlib.Sum),
                  "a name in flight", match="already in flight")
commlib.barrier()
if r == n - 1:
    h = commlib.allreduce_async_(a, name="dup", op=commlib.Sum)
check_equal(commlib.synchronize(h), refs[commlib.Sum], "the first request still completes")

e = np.empty(0, np.float32)
for rep in range(2):
    out = commlib.synchronize(commlib.allreduce_async_(e, name="empty", op=commlib.Sum))
    check_equal(out, np.empty(0, np.float32), f"an empty array (repeat {rep})")
check_equal(run("after", op=commlib.Sum), refs[commlib.Sum], "a collective after the errors")

# A call repeating the last one on an array word for word submits its request
# again (commlib.submit.quick_repeat); anything else about the call or the
# array changed must still be seen.
for rep in range(3):
    check_equal(run("q", op=commlib.Sum), refs[commlib.Sum], f"a repeated call (repeat {rep})")
check_equal(run("q", op=commlib.Max), refs[commlib.Max], "the same name, another op")
check_equal(run("q", op=commlib.Max, postscale_factor=2.0), refs[commlib.Max] * 2, "another scale")
check_equal(run("q", op=commlib.Max), refs[commlib.Max], "back to the earlier arguments")
check_equal(run("q", op=commlib.Sum), refs[commlib.Sum], "op Sum again")
expect_raises(ValueError, lambda: commlib.allreduce_async_(a, name="q", op=False),
              "False after op Sum (0) under one name", match="unsupported reduction op")
check_equal(run("q", op=commlib.Sum, process_set=commlib.global_process_set), refs[commlib.Sum],
            "the same call with the global set given")
b = np.empty(6, np.float64)
for rep in range(2):
    b[:] = per_rank[r]
    commlib.synchronize(commlib.allreduce_async_(b, name="qb", op=commlib.Sum))
b.shape = (2, 3)  # (the same array object, reshaped in place)
b[:] = per_rank[r].reshape(2, 3)
out = commlib.synchronize(commlib.allreduce_async_(b, name="qb", op=commlib.Sum))
check_equal(out, refs[commlib.Sum].reshape(2, 3), "a repeated call on an array reshaped in place")
commlib.synchronize(commlib.allreduce_async_(b, name="qb", op=commlib.Sum))
if r == 0:
    b.shape = (3, 2)  # (rank 0's request now differs from the others')
expect_raises(commlib.CollectiveMismatchError,
              lambda: commlib.synchronize(commlib.allreduce_async_(b, name="qb", op=commlib.Sum)),
              "a repeated call after rank 0 alone reshaped its array", match="shape")
b.shape = (2, 3)
b.dtype = np.int64  # (the same bytes seen as another dtype)
for rep in range(2):
    b[:] = np.arange(6).reshape(2, 3) + r
    out = commlib.synchronize(commlib.allreduce_async_(b, name="qb", op=commlib.Sum))
    check_equal(out, np.sum([np.arange(6).reshape(2, 3) + q for q in range(n)], axis=0),
                f"a repeated call on an array whose dtype changed in place (repeat {rep})")
b.flags.writeable = False
expect_raises(ValueError, lambda: commlib.allreduce_async_(b, name="qb", op=commlib.Sum),
              "a repeated call on an array made read-only", match="read-only")

# A group's layout is cached by its arrays' identities; what changes in place
# must still be seen.
g = [np.full(4, r + 1.0, np.float32) for _ in range(3)]
for rep in range(2):
    for x in g:
        x[:] = r + 1
    outs = commlib.grouped_allreduce(g, op=commlib.Sum, name="grp.oop")
    check_equal(outs[1], np.full(4, n * (n + 1) / 2, np.float32), f"a grouped allreduce (repeat {rep})")
    commlib.grouped_allreduce_(g, op=commlib.Sum, name="grp")
    check_equal(g[1], np.full(4, n * (n + 1) / 2, np.float32), f"a grouped allreduce_ (repeat {rep})")
g[1].dtype = np.int32  # (the same bytes seen as another dtype; values far from float32's)
big = 500_000_000
want = np.full(4, n * big + n * (n - 1) // 2, np.int32)
g[1][:] = big + r
check_equal(commlib.grouped_allreduce(g, op=commlib.Sum, name="grp.oop")[1], want,
            "grouped, a member's dtype changed in place")
commlib.grouped_allreduce_(g, op=commlib.Sum, name="grp")
check_equal(g[1], want, "grouped in place, a member's dtype changed")
g[2].shape = (2, 2)
outs = commlib.grouped_allreduce(g, op=commlib.Sum, name="grp.oop")
if outs[2].shape != (2, 2):
    fail(f"grouped, a member reshaped in place: a result of shape {outs[2].shape}")
done()

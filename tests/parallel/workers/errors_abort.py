"""A request that fails its checks on one rank (alltoall splits that do not
add up to the rows) fails on the other ranks at once, naming the rank and
its reason, instead of leaving them waiting: named, unnamed, and a name the
response cache holds. The job goes on working afterwards, and the name
too: after the same bad call on every rank, after one rank's bad calls
twice in a row (each rank's k-th call of a name pairs with the others'
k-th), retried at once, and after a bad call while the others had joined."""
import time

import numpy as np

import commlib
from _common import check_equal, done, expect_raises, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
BAD = 1  # the rank whose arguments are wrong


def case(name, what):
    x = np.arange(2 * n, dtype=np.float32).reshape(2 * n, 1)
    splits = [2] * n
    if r == BAD:
        splits[0] += 1  # one row too many
        expect_raises(ValueError, lambda: commlib.alltoall(x, splits=splits, name=name),
                      f"{what}: the rank with bad splits", match="splits sum to")
        return
    start = time.monotonic()
    e = expect_raises(commlib.CollectiveMismatchError, lambda: commlib.alltoall(x, splits=splits, name=name),
                      f"{what}: a rank with good splits", match=f"rank {BAD} could not submit alltoall")
    if "splits sum to" not in str(e):
        fail(f"{what}: the error does not give rank {BAD}'s reason: {e}")
    if time.monotonic() - start > 5:
        fail(f"{what}: took {time.monotonic() - start:.1f} s (COMMLIB_TIMEOUT is 300 s: it should be at once)")


def still_works(tag):
    got = commlib.allreduce(np.full(3, float(r)), name=f"works.{tag}", op=commlib.Sum)
    check_equal(got, np.full(3, float(sum(range(n)))), f"allreduce after {tag}")


case("a2a.named", "named")
still_works("named")
case(None, "unnamed")
still_works("unnamed")
for i in range(4):  # "a2a.cached" in the response cache, then bad on one rank
    got, _ = commlib.alltoall(np.full((n, 1), float(r)), splits=[1] * n, name="a2a.cached")
    check_equal(got, np.arange(n, dtype=np.float64).reshape(n, 1), f"cached alltoall {i}")
case("a2a.cached", "cached")
still_works("cached")
# A grouped in-place allreduce given one array twice (it would be reduced
# twice) on rank BAD: refused there, and the others fail at once.
a, b = np.ones(4), np.ones(4)
group = [a, a] if r == BAD else [a, b]
start = time.monotonic()
if r == BAD:
    expect_raises(ValueError, lambda: commlib.grouped_allreduce_(group, name="g.aliased", op=commlib.Sum),
                  "a group with one array twice", match="tensors 0 and 1 would share memory")
    expect_raises(ValueError, lambda: commlib.grouped_allreduce_([a, a[1:3]], name="g.alias2"),
                  "a group with overlapping views", match="tensors 0 and 1 would share memory")
else:
    expect_raises(commlib.CollectiveMismatchError,
                  lambda: commlib.grouped_allreduce_(group, name="g.aliased", op=commlib.Sum),
                  "a good group", match=f"rank {BAD} could not submit allreduce 'g.aliased'")
    expect_raises(commlib.CollectiveMismatchError, lambda: commlib.grouped_allreduce_(group, name="g.alias2"),
                  "a good group again", match="share memory")
if time.monotonic() - start > 5:
    fail(f"aliased group: took {time.monotonic() - start:.1f} s")
got = commlib.grouped_allreduce([a, a], name="g.twice.out", op=commlib.Sum)  # (out of place: fine)
check_equal(got[0], np.full(4, float(n)), "a group reading one array twice")
still_works("aliased group")
for i in range(3):  # and the name works again
    got, _ = commlib.alltoall(np.full((n, 1), float(r)), splits=[1] * n, name="a2a.cached")
    check_equal(got, np.arange(n, dtype=np.float64).reshape(n, 1), f"cached alltoall again {i}")


def good_alltoall(name, what):
    got, _ = commlib.alltoall(np.full((n, 1), float(r)), splits=[1] * n, name=name)
    check_equal(got, np.arange(n, dtype=np.float64).reshape(n, 1), what)


def bad_alltoall(name, what):
    x = np.zeros((2 * n, 1), np.float32)
    expect_raises(ValueError, lambda: commlib.alltoall(x, splits=[3] + [2] * (n - 1), name=name), what,
                  match="splits sum to")


# The same bad call on every rank (each rank's abort reaches rank 0), twice,
# then good calls of that name, retried at once: a named one, and one the
# response cache holds.
for name in ("a2a.everyone", "a2a.cached"):
    for i in range(2):
        bad_alltoall(name, f"{name}: bad splits on every rank ({i})")
    for i in range(3):
        good_alltoall(name, f"{name}: after the bad call on every rank ({i})")
still_works("every rank bad")
# Rank BAD's bad call twice in a row: the others' first two calls fail (they
# pair with those), their third works with rank BAD's third.
for name in ("a2a.twice", "a2a.cached"):
    for i in range(2):
        if r == BAD:
            bad_alltoall(name, f"{name}: rank {BAD}'s bad call {i}")
        else:
            expect_raises(commlib.CollectiveMismatchError,
                          lambda: commlib.alltoall(np.zeros((n, 1)), splits=[1] * n, name=name),
                          f"{name}: a good call paired with rank {BAD}'s bad call {i}",
                          match=f"rank {BAD} could not submit alltoall")
    good_alltoall(name, f"{name}: the calls after two bad ones")
still_works("bad twice")
# A bad call while the other ranks have joined (uneven work): nobody else
# takes part in it, and after the join every rank's calls of that name pair.
if r == 0:
    bad_alltoall("a2a.joined", "a bad call while the others have joined")
    got = commlib.allreduce(np.ones(2), name="works.joined", op=commlib.Sum)
    check_equal(got, np.ones(2), "an allreduce while the others have joined")
commlib.join()
for i in range(2):
    good_alltoall("a2a.joined", f"a2a.joined: after the join ({i})")
still_works("join")
done()
commlib.shutdown()

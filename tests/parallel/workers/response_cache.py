"""The response cache: repeated, identically described requests skip the
coordinator, and nothing about the results changes.

1. Steady state: rounds of named collectives of every kind (fused async
   allreduces of several dtypes, a grouped allreduce, allgather with rows that
   differ by rank, broadcast, alltoall with uneven splits, reducescatter,
   barrier) are right on every rank each round, and the cache served them
   (hits, all of which ran).
2. A cached name resubmitted with another shape on every rank: the cache
   invalidates it and the new shape is reduced right.
3. A cached name resubmitted with another shape on one rank only, then as
   another collective: CollectiveMismatchError on every rank, and the name
   works again afterwards.
4. Global cached collectives interleaved with collectives of a process set.
5. A rank late by more than the cache's patience (COMMLIB_STALL_CHECK_TIME=2:
   1 s): the others' cached request goes to the coordinator; all complete.
6. (3+ ranks) The order log's ring fills up while some ranks are busy: the
   appends wait, and every result is still right.

argv[1] == "small": COMMLIB_CACHE_CAPACITY is tiny, so most names find no bit;
"off": the cache must be off (COMMLIB_CACHE_CAPACITY=0).
"""
import sys
import time

import numpy as np

import commlib
from _common import check_equal, done, expect_raises, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
mode = sys.argv[1] if len(sys.argv) > 1 else ""
small, off = mode == "small", mode == "off"
ROUNDS = 12
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.float16, np.uint8]


def step(k):
    """One round of every kind of collective, checked against numpy."""
    # fused async allreduces of several dtypes
    xs = [np.arange(7 + i, dtype=dt) % 5 + r + k for i, dt in enumerate(DTYPES)]
    hs = [commlib.allreduce_async_(x, op=commlib.Sum, name=f"grad.{i}") for i, x in enumerate(xs)]
    for i, h in enumerate(hs):
        want = sum((np.arange(7 + i) % 5 + q + k) for q in range(n)).astype(DTYPES[i])
        check_equal(commlib.synchronize(h), want, f"round {k} grad.{i}")
    # average with a scale factor
    got = commlib.allreduce(np.full(5, float(r + k)), name="avg", prescale_factor=2.0)
    check_equal(got, np.full(5, 2.0 * (sum(range(n)) / n + k)), f"round {k} avg")
    # grouped
    g = commlib.grouped_allreduce([np.full(3, r + k, np.int64), np.full((2, 2), 1.0)], op=commlib.Sum,
                                  name="group")
    check_equal(g[0], np.full(3, sum(range(n)) + n * k, np.int64), f"round {k} group.0")
    check_equal(g[1], np.full((2, 2), float(n)), f"round {k} group.1")
    # allgather: rank q contributes q + 1 rows
    got = commlib.allgather(np.full((r + 1, 2), r * 10 + k, np.int32), name="gather")
    want = np.concatenate([np.full((q + 1, 2), q * 10 + k, np.int32) for q in range(n)])
    check_equal(got, want, f"round {k} allgather")
    # broadcast from the last rank
    got = commlib.broadcast(np.full(4, r + k, np.float32), root_rank=n - 1, name="bcast")
    check_equal(got, np.full(4, n - 1 + k, np.float32), f"round {k} broadcast")
    # alltoall: rank q sends q + d + 1 rows to rank d
    splits = [r + d + 1 for d in range(n)]
    got, received = commlib.alltoall(np.full(sum(splits), r + k, np.int64), splits=splits, name="a2a")
    want = np.concatenate([np.full(q + r + 1, q + k, np.int64) for q in range(n)])
    check_equal(got, want, f"round {k} alltoall")
    check_equal(np.asarray(received), np.array([q + r + 1 for q in range(n)]), f"round {k} alltoall splits")
    # reducescatter
    got = commlib.reducescatter(np.arange(2 * n, dtype=np.float64) + k, op=commlib.Sum, name="rs")
    check_equal(got, (np.arange(2 * n, dtype=np.float64) + k)[2 * r:2 * r + 2] * n, f"round {k} rs")
    commlib.barrier()


for k in range(ROUNDS):
    step(k)
stats = commlib.response_cache_stats()
if off and any(stats.values()):
    fail(f"the cache should be off: {stats}")
if stats["cached_runs"] != stats["hits"]:
    fail(f"every hit should have run through the cache: {stats}")
if not (small or off) and stats["hits"] < (ROUNDS - 3) * 12:
    fail(f"steady-state rounds should hit the cache: {stats}")
if small and stats["misses"] < ROUNDS * 6:
    fail(f"a 2-bit cache cannot hold 14 names: {stats}")

# 2. every rank changes the shape of a cached name
for k in range(4):
    got = commlib.allreduce(np.full(3, float(r)), name="shape", op=commlib.Sum)
    check_equal(got, np.full(3, float(sum(range(n)))), "shape (3)")
before = commlib.response_cache_stats()["invalidations"]
got = commlib.allreduce(np.full(6, float(r)), name="shape", op=commlib.Sum)
check_equal(got, np.full(6, float(sum(range(n)))), "shape changed to (6)")
# (the first rank to submit invalidates; the others may read that first and miss)
changed = commlib.allreduce(np.array(commlib.response_cache_stats()["invalidations"] - before),
                            op=commlib.Sum, name="count.invalidations")
if not (small or off) and changed < 1:
    fail("a changed request should invalidate its cache bit")
for k in range(3):
    check_equal(commlib.allreduce(np.full(6, 1.0), name="shape", op=commlib.Sum), np.full(6, float(n)),
                "shape (6) again")

# 3. one rank changes a cached request: a mismatch everywhere, then recovery
for k in range(4):
    commlib.allreduce(np.ones(4), name="mm", op=commlib.Sum)
shape = 5 if r == 0 else 4
err = expect_raises(commlib.CollectiveMismatchError,
                    lambda: commlib.allreduce(np.ones(shape), name="mm", op=commlib.Sum),
                    "shape differing on rank 0 after caching", match="shape")
if "rank 0" not in str(err):
    fail(f"mismatch error does not name rank 0: {err}")
for k in range(3):
    check_equal(commlib.allreduce(np.ones(4), name="mm", op=commlib.Sum), np.full(4, float(n)), "mm again")
if r == n - 1:
    expect_raises(commlib.CollectiveMismatchError,
                  lambda: commlib.broadcast(np.ones(4), root_rank=0, name="mm"),
                  "broadcast under a cached allreduce's name", match="collective operation")
else:
    expect_raises(commlib.CollectiveMismatchError,
                  lambda: commlib.allreduce(np.ones(4), name="mm", op=commlib.Sum),
                  "allreduce while one rank broadcasts", match="collective operation")
check_equal(commlib.allreduce(np.ones(4), name="mm", op=commlib.Sum), np.full(4, float(n)), "mm after")

# 4. a process set's collectives between cached global ones
members = [0, 1] if n > 2 else [1]  # (a set cannot repeat the global one)
ps = commlib.add_process_set(members)
for k in range(6):
    h = commlib.allreduce_async(np.full(2, r + k, np.float64), name="global", op=commlib.Sum)
    if r in members:
        got = commlib.allreduce(np.full(2, r + k, np.float64), name="pair", op=commlib.Sum, process_set=ps)
        check_equal(got, np.full(2, float(sum(q + k for q in members))), f"set allreduce {k}")
    check_equal(commlib.synchronize(h), np.full(2, float(sum(range(n)) + n * k)), f"global {k}")
commlib.remove_process_set(ps)

# 5. a rank later than the cache's patience
for k in range(4):
    commlib.allreduce(np.ones(2), name="late", op=commlib.Sum)
if r == n - 1:
    time.sleep(2.5)
check_equal(commlib.allreduce(np.ones(2), name="late", op=commlib.Sum), np.full(2, float(n)), "late")
for k in range(3):
    check_equal(commlib.allreduce(np.ones(2), name="late", op=commlib.Sum), np.full(2, float(n)),
                "late, then on time")

# 6. the order log's ring fills up: rank 0 alone (a set of its own) runs
# many small collectives, each one an entry, while the other ranks are busy in
# large ones and read nothing; rank 0's entries wait, nothing is lost.
if n >= 3:
    alone = commlib.add_process_set([0])
    rest = commlib.add_process_set(list(range(1, n)))
    if r == 0:
        for k in range(600):
            got = commlib.allreduce(np.full(2, float(k)), name="alone", op=commlib.Sum, process_set=alone)
            check_equal(got, np.full(2, float(k)), f"alone {k}")
    else:
        big = np.ones(4 << 20, np.float32)
        for k in range(4):
            got = commlib.allreduce(big, name=f"big.{k}", op=commlib.Sum, process_set=rest)
            if got[0] != n - 1 or got[-1] != n - 1:
                fail(f"big allreduce {k}: {got[:2]}")
    check_equal(commlib.allreduce(np.ones(3), name="after.ring", op=commlib.Sum), np.full(3, float(n)),
                "after the ring filled up")
    commlib.remove_process_set(alone)
    commlib.remove_process_set(rest)

print(f"rank {r}: stats {commlib.response_cache_stats()}", flush=True)
done()

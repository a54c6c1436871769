"""Randomised rounds against the response cache: every rank submits the same
requests asynchronously but in its own shuffled order, waits for them in
another shuffled order, and checks every result. Names come from a small
pool, so they are cached, and now and then a name changes its shape or its
collective on every rank (invalidating its bit). A wrong execution order
would deadlock (the launcher's timeout fails the test) or mix up results.

argv[1]: the number of rounds.
"""
import random
import sys

import numpy as np

import commlib
from _common import check_equal, done

commlib.init()
r, n = commlib.rank(), commlib.size()
rounds = int(sys.argv[1])
shared = random.Random(1234)       # the same draws on every rank
mine = random.Random(99 + 31 * r)  # this rank's own orders
POOL = [f"t{i}" for i in range(10)]
kinds = {name: shared.choice(["allreduce", "broadcast", "allgather"]) for name in POOL}
sizes = {name: shared.randint(1, 300) for name in POOL}
roots = {name: shared.randrange(n) for name in POOL}

for k in range(rounds):
    names = shared.sample(POOL, shared.randint(1, len(POOL)))
    for name in names:
        if shared.random() < 0.05:  # the request changes on every rank
            kinds[name] = shared.choice(["allreduce", "broadcast", "allgather"])
            sizes[name] = shared.randint(1, 300)
            roots[name] = shared.randrange(n)
    order = names[:]
    mine.shuffle(order)
    handles = {}
    for name in order:
        x = np.arange(sizes[name], dtype=np.float32) + r + k
        if kinds[name] == "allreduce":
            handles[name] = commlib.allreduce_async(x, name=name, op=commlib.Sum)
        elif kinds[name] == "broadcast":
            handles[name] = commlib.broadcast_async(x, root_rank=roots[name], name=name)
        else:
            handles[name] = commlib.allgather_async(x, name=name)
    wait = names[:]
    mine.shuffle(wait)
    for name in wait:
        got = commlib.synchronize(handles[name])
        base = np.arange(sizes[name], dtype=np.float32) + k
        if kinds[name] == "allreduce":
            want = base * n + sum(range(n))
        elif kinds[name] == "broadcast":
            want = base + roots[name]
        else:
            want = np.concatenate([base + q for q in range(n)])
        check_equal(got, want.astype(np.float32), f"round {k} {name} ({kinds[name]})")
stats = commlib.response_cache_stats()
print(f"rank {r}: stats {stats}", flush=True)
if n > 1 and stats["hits"] < rounds:
    from _common import fail
    fail(f"the pool's names should hit the cache: {stats}")
done()

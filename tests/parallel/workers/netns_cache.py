"""The response cache across two real hosts (network namespaces): rounds of
named collectives, each checked against numpy on every rank, hit the cache
once seen (hits grow round after round, and every hit ran)."""
import sys

import numpy as np

import commlib
from _common import check_equal, done, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
ROUNDS, NAMES = 12, 4
hits = []
for k in range(ROUNDS):
    hs = [commlib.allreduce_async(np.arange(5 + i, dtype=np.float64) * (r + k), op=commlib.Sum,
                                  name=f"grad.{i}") for i in range(NAMES - 2)]
    for i, h in enumerate(hs):
        check_equal(commlib.synchronize(h), np.arange(5 + i) * float(n * k + n * (n - 1) / 2), f"round {k} grad.{i}")
    got = commlib.allgather(np.full((r + 1, 2), r + k, np.int32), name="gather")
    check_equal(got, np.concatenate([np.full((q + 1, 2), q + k, np.int32) for q in range(n)]), f"round {k} gather")
    got = commlib.broadcast(np.full(3, r * 10 + k, np.int64), root_rank=n - 1, name="bcast")
    check_equal(got, np.full(3, (n - 1) * 10 + k, np.int64), f"round {k} broadcast")
    hits.append(commlib.response_cache_stats()["hits"])
stats = commlib.response_cache_stats()
print(f"rank {r}: hits per round {hits}; {stats}", flush=True)
if stats["cached_runs"] != stats["hits"]:
    fail(f"every hit should have run through the cache: {stats}")
if stats["hits"] < (ROUNDS - 2) * NAMES:
    fail(f"steady-state rounds should hit the cache: {stats}")
if any(b - a < NAMES for a, b in zip(hits[2:], hits[3:])):
    fail(f"every steady round should add {NAMES} hits: {hits}")
done()

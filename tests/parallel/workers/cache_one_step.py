"""A step of 128 cached allreduces, submitted separately, runs as one fused
collective (one order log entry holds them all) at 2 ranks. Run with
batching held until a thread waits (COMMLIB_BATCH_GAP_US, COMMLIB_CYCLE_TIME
large), and rank 1 waiting last in the last step, so that rank 1 completes all 128 at once;
each rank counts, in its own timeline, the executions of the last step (one
start time per fused collective). argv[1]: the timeline path."""
import json
import os
import sys
import time

import numpy as np
from _common import check_equal

import commlib

path = sys.argv[1]
commlib.init()
r, n = commlib.rank(), commlib.size()
COUNT, STEPS = 128, 4
xs = [np.empty(1024, np.float32) for _ in range(COUNT)]
commlib.start_timeline(path)
for step in range(STEPS):
    for i, x in enumerate(xs):
        x[:] = r + i + step
    hs = [commlib.allreduce_async_(x, op=commlib.Sum, name=f"step.{i}") for i, x in enumerate(xs)]
    if r == 1 and step == STEPS - 1:
        time.sleep(0.5)  # (rank 0's arrivals are all in first)
    for i, (h, x) in enumerate(zip(hs, xs)):
        commlib.synchronize(h)
        check_equal(x, np.full(1024, sum(q + i + step for q in range(n)), np.float32), f"step {step} tensor {i}")
    commlib.barrier()
stats = commlib.response_cache_stats()
commlib.stop_timeline()
commlib.shutdown()

# The first steps are negotiated by rank 0 (the cache learns them); the last one hits the cache.
if stats["hits"] < COUNT:
    print(f"rank {r}: FAILED: cache stats {stats}", file=sys.stderr, flush=True)
    sys.exit(1)
stem, ext = os.path.splitext(path)
with open(path if r == 0 else f"{stem}.rank{r}{ext}", encoding="utf-8") as f:
    events = json.load(f)
tids = {e["tid"] for e in events if e.get("name") == "thread_name" and e["args"]["name"].startswith("step.")}
runs = sorted(e["ts"] for e in events if e.get("name") == "allreduce" and e["tid"] in tids)
if len(runs) != COUNT * STEPS:
    print(f"rank {r}: FAILED: {len(runs)} allreduce spans, expected {COUNT * STEPS}", file=sys.stderr, flush=True)
    sys.exit(1)
last_step = runs[-COUNT:]
starts = sorted(set(last_step))
if len(starts) != 1:
    print(f"rank {r}: FAILED: the last step ran as {len(starts)} collectives (sizes "
          f"{[last_step.count(s) for s in starts]}), expected one", file=sys.stderr, flush=True)
    sys.exit(1)
print(f"rank {r}: OK", flush=True)

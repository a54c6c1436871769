"""Collectives of a process set without rank 0 after rank 0 has shut down.

argv[1] picks the case:
  trio (4 ranks): the set {1, 2, 3}; rank 0 shuts down at once.
  pair (4 ranks): the set {1, 2}; rank 3, in no such set, waits idle (its
      collectives refused at once) while ranks 1 and 2 run 300 collectives
      more than the order log's ring holds: it must not hold them back.
  kill (3 ranks): the set {1, 2}; rank 2 SIGKILLs itself after rank 0 left:
      rank 1 raises RankLostError naming it, and rank 0's shutdown returns.

Rank 0's shutdown() returns only once the set's members have shut down (or
one died): each prints when (the test compares). The others first wait for rank 0's departure: a collective of
the whole job, which rank 0 never submits, fails with NotInitializedError
naming rank 0 when rank 0 leaves; the next one fails at once.
"""
import os
import signal
import sys
import time

import numpy as np

import commlib
from _common import check_equal, done, expect_raises, fail
from _set_collectives import check_set_collectives

case = sys.argv[1]
commlib.init()
r, n = commlib.rank(), commlib.size()
if n != (3 if case == "kill" else 4):
    fail(f"run case {case} on {3 if case == 'kill' else 4} ranks")
members = [1, 2, 3] if case == "trio" else [1, 2]
ps = commlib.add_process_set(members)
commlib.allreduce(np.ones(2), name="warmup")

if r == 0:
    commlib.shutdown()
    print(f"rank 0: shutdown() returned at {time.time():.6f}", flush=True)
    print("rank 0: OK", flush=True)  # (after the kill, MPI is aborted at exit: the job is broken)
    sys.exit(0)

# Rank 0's departure, then at once.
expect_raises(commlib.NotInitializedError, lambda: commlib.allreduce(np.ones(2), name="probe"),
              "the whole job's collective rank 0 never submits", match="rank 0")
start = time.monotonic()
expect_raises(commlib.NotInitializedError, lambda: commlib.allgather(np.ones(2), name="later"),
              "a whole job's collective after rank 0 left", match="rank 0")
if time.monotonic() - start > 2:
    fail(f"a whole job's collective took {time.monotonic() - start:.1f} s to fail")

if r not in members:  # (pair: rank 3)
    check_equal(commlib.recv(src=1, tag=7), np.arange(4.0), "the end of the pair's collectives")
    done()
    sys.exit(0)

if case == "kill":
    check_set_collectives(ps, "before")
    if r == 2:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for i in range(100000):
            commlib.allreduce(np.ones(100), name=f"step.{i}", process_set=ps)
    except commlib.RankLostError as e:
        if "rank 2" not in str(e):
            fail(f"RankLostError does not name rank 2: {e}")
        print(f"rank {r}: RankLostError: {e}", flush=True)
        os._exit(3)
    fail("the collectives went on without rank 2")

check_set_collectives(ps, "set")
steps = 300 if case == "pair" else 20
for i in range(steps):
    check_equal(commlib.allreduce(np.full(7, float(r * i)), op=commlib.Sum, name=f"step.{i}", process_set=ps),
                np.full(7, float(sum(members) * i)), f"step {i}")
if case == "pair" and r == 1:
    commlib.send(np.arange(4.0), dst=3, tag=7)
done()
print(f"rank {r}: shutdown() called at {time.time():.6f}", flush=True)
commlib.shutdown()

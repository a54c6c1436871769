"""COMMLIB_TIMEOUT (set to 2 s by the test): requests some ranks never take
part in fail on the ranks that wait, with CollectiveTimeoutError naming the
operation, the tensor and the missing ranks, within the timeout + a few
seconds; the job goes on working after each. Cases: a named tensor one rank
never submits; unnamed collectives of different kinds; a cached request one
rank skips; a receive with no send; sends with no receive (to another rank,
small and large, and to itself: the receiver drops them); a rank frozen (SIGSTOP) for less than
the timeout (no error) and for longer (errors, and the job still works)."""
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import commlib
from _common import check_equal, done, expect_raises, fail, stop_process

commlib.init()
r, n = commlib.rank(), commlib.size()
T = float(os.environ["COMMLIB_TIMEOUT"])
pids = commlib.allgather(np.array([os.getpid()]), name="pids")


def expect_timeout(fn, what, missing):
    start = time.monotonic()
    e = expect_raises(commlib.CollectiveTimeoutError, fn, what)
    took = time.monotonic() - start
    if took > T + 5:
        fail(f"{what}: the timeout took {took:.1f} s (COMMLIB_TIMEOUT {T:.0f} s)")
    for m in missing:
        if str(m) not in str(e).split("never by ranks")[-1]:
            fail(f"{what}: the error does not name missing rank {m}: {e}")
    return e


def skip():
    """A rank that skips a case waits until the others have timed out (its
    next request would otherwise time out waiting for them)."""
    time.sleep(T + 2)


def still_works(tag):
    got = commlib.allreduce(np.full(3, float(r)), name=f"works.{tag}", op=commlib.Sum)
    check_equal(got, np.full(3, float(sum(range(n)))), f"allreduce after {tag}")


# 1. A named tensor the last rank never submits.
if r != n - 1:
    e = expect_timeout(lambda: commlib.allreduce(np.ones(2), name="never.last"), "named", [n - 1])
    if "'never.last'" not in str(e) or "allreduce" not in str(e):
        fail(f"the error does not name the operation and tensor: {e}")
else:
    skip()
still_works("named")

# 2. Unnamed collectives of different kinds (different generated names).
if r == 0:
    expect_timeout(lambda: commlib.allreduce(np.ones(2)), "unnamed allreduce", list(range(1, n)))
else:
    expect_timeout(lambda: commlib.allgather(np.ones((1, 2))), "unnamed allgather", [0])
still_works("unnamed")

# 3. A request in the response cache that rank 1 skips once.
for _ in range(4):
    commlib.allreduce(np.ones(2), name="cached", op=commlib.Sum)
if r != 1:
    expect_timeout(lambda: commlib.allreduce(np.ones(2), name="cached", op=commlib.Sum), "cached", [1])
else:
    skip()
still_works("cached")

# 4. A receive with no matching send.
if r == 0:
    e = expect_raises(commlib.CollectiveTimeoutError, lambda: commlib.recv(src=1, tag=5),
                      "unmatched recv", match="recv from rank 1 (tag 5)")
else:
    skip()
still_works("recv")

# 5. Sends with no matching receive fail (eager and rendezvous, to rank 1 and
# to itself); the receiver drops them: rank 1's later receives find nothing.
if r == 0:
    large = commlib.isend(np.ones(200_000), dst=1, tag=7)
    to_self = commlib.isend(np.ones(2), dst=0, tag=8)
    start = time.monotonic()
    expect_raises(commlib.CollectiveTimeoutError, lambda: commlib.send(np.arange(3.0), dst=1, tag=6),
                  "unmatched send", match="send to rank 1 (tag 6) timed out after 2 s")
    if time.monotonic() - start > T + 5:
        fail(f"unmatched send: the timeout took {time.monotonic() - start:.1f} s")
    expect_raises(commlib.CollectiveTimeoutError, lambda: commlib.synchronize(large), "unmatched large send",
                  match="send to rank 1 (tag 7) timed out")
    expect_raises(commlib.CollectiveTimeoutError, lambda: commlib.synchronize(to_self), "unmatched send to itself",
                  match="send to rank 0 (tag 8) timed out")
elif r == 1:
    time.sleep(T + 3)  # (rank 0's sends withdrawn by now)
    for tag in (6, 7):
        expect_timeout(lambda: commlib.recv(src=0, tag=tag), f"recv of a withdrawn send (tag {tag})", [])
MPI.COMM_WORLD.Barrier()  # (not a commlib collective: the ranks arrive seconds apart)
still_works("send")

# 6. Rank 1 frozen for less than the timeout: no error anywhere.
if r == 0:
    os.kill(int(pids[1]), signal.SIGSTOP)
    h = commlib.allreduce_async(np.ones(2), name="short.freeze", op=commlib.Sum)
    time.sleep(T / 3)
    os.kill(int(pids[1]), signal.SIGCONT)
    check_equal(commlib.synchronize(h), np.full(2, float(n)), "short freeze")
else:
    check_equal(commlib.allreduce(np.ones(2), name="short.freeze", op=commlib.Sum), np.full(2, float(n)),
                "short freeze")
still_works("short freeze")

# 7. Rank 1 frozen for longer: the others' request fails naming it; once it
# runs again, its own request (that nobody else submits any more) fails too.
commlib.barrier()
if r == 0:
    stop_process(int(pids[1]))
if r != 1:
    expect_timeout(lambda: commlib.allreduce(np.ones(2), name="long.freeze"), "long freeze", [1])
    if r == 0:
        os.kill(int(pids[1]), signal.SIGCONT)
    skip()  # (while rank 1's own request times out)
else:
    time.sleep(0.5)  # (stopped in here, or around it)
    others = [q for q in range(n) if q != 1]
    expect_timeout(lambda: commlib.allreduce(np.ones(2), name="long.freeze"), "after the freeze", others)
still_works("long freeze")
done()
commlib.shutdown()

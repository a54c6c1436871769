"""Point-to-point failure paths, one per mode (argv[1]):
- dead: the last rank SIGKILLs itself while rank 0 waits to receive from it
  and has a send to it outstanding; rank 0 must raise RankLostError naming it
  (then exits with code 3), well within the collectives' bound;
- stall: rank 0's receive waits 3 s for rank 1's send (COMMLIB_STALL_CHECK_TIME=1
  makes the core warn, naming source and tag), then completes;
- shutdown: rank 1 shuts down while rank 0 waits to receive from it: rank 0's
  receive fails with NotInitializedError naming rank 1, instead of hanging."""
import os
import signal
import sys
import time

import numpy as np

import commlib
from _common import check_equal, done, expect_raises, fail

mode = sys.argv[1]
commlib.init()
me, n = commlib.rank(), commlib.size()
victim = n - 1

if mode == "dead":
    commlib.barrier()
    if me == victim:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    if me == 0:
        start = time.monotonic()
        s = commlib.isend(np.ones(200000), dst=victim, tag=1)  # rendezvous: waits for the victim
        try:
            commlib.recv(src=victim, tag=2)
        except commlib.RankLostError as e:
            elapsed = time.monotonic() - start
            print(f"rank 0: RankLostError after {elapsed:.1f}s: {e}", flush=True)
            if f"rank {victim}" not in str(e):
                fail(f"error does not name rank {victim}: {e}")
            if elapsed > 60:
                fail(f"took {elapsed:.1f}s to notice the lost rank")
            expect_raises(commlib.RankLostError, lambda: commlib.synchronize(s), "the send to the lost rank")
            print("rank 0: send failed too", flush=True)
            sys.stdout.flush()
            os._exit(3)
        fail("recv from a dead rank returned")
    time.sleep(120)  # the others: the launcher ends the job
elif mode == "stall":
    if me == 0:
        # (a blocking receive into out: waits past its first time slice)
        got = commlib.recv(src=1, tag=77, out=np.zeros(5, dtype=np.int64))
        check_equal(got, np.arange(5, dtype=np.int64), "late message")
    elif me == 1:
        time.sleep(3)
        commlib.send(np.arange(5, dtype=np.int64), dst=0, tag=77)
    commlib.barrier()
    done()
elif mode == "shutdown":
    if me == 1:
        commlib.barrier()
        time.sleep(0.3)
        commlib.shutdown()
        print("rank 1: OK", flush=True)
    elif me == 0:
        h = commlib.irecv(src=1, tag=5)
        commlib.barrier()
        expect_raises(commlib.NotInitializedError, lambda: commlib.synchronize(h),
                      "recv from a rank that shut down", "rank 1 called shutdown()")
        expect_raises(commlib.NotInitializedError, lambda: commlib.send(np.ones(3), dst=1),
                      "send to a rank that shut down", "rank 1 has called shutdown()")
        done()
    else:
        commlib.barrier()
        done()
else:
    fail(f"unknown mode {mode}")

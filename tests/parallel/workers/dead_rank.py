"""One rank SIGKILLs itself while the others are in (or enter) collectives.
The survivors must raise commlib.RankLostError naming the lost rank within
60 s (no hang), then exit with code 3 so the test can tell them apart."""
import os
import signal
import sys
import time

import numpy as np

import commlib
from _common import fail

commlib.init()
victim = int(sys.argv[1]) if len(sys.argv) > 1 else 1
me = commlib.rank()
commlib.allreduce(np.ones(4), name="warmup")
if me == victim:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
start = time.monotonic()
try:
    for i in range(1000000):
        commlib.allreduce(np.ones(1000), name=f"step.{i}")
except commlib.RankLostError as e:
    elapsed = time.monotonic() - start
    print(f"rank {me}: RankLostError after {elapsed:.1f}s: {e}", flush=True)
    if f"rank {victim}" not in str(e):
        fail(f"error does not name rank {victim}: {e}")
    if elapsed > 60:
        fail(f"took {elapsed:.1f}s to notice the lost rank")
    # Later collectives fail at once with the same error instead of hanging.
    try:
        commlib.barrier()
    except commlib.RankLostError:
        print(f"rank {me}: later collective also raised", flush=True)
        sys.stdout.flush()
        os._exit(3)
    fail("a collective after the lost rank did not raise")
fail("the loop ended without an error")

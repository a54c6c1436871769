"""Run by tests/gpu with COMMLIB_TIMEOUT set: the last rank stops taking part
and the others' CUDA allreduce fails with CollectiveTimeoutError within the
timeout + 10 s. argv[1]: sleeps (it never submits: the negotiation times out
and names it) or frozen (it submits, then rank 0 stops it with SIGSTOP inside
the NCCL collective: the GPU-side timeout aborts the communicator). The
stopped rank then leaves without shutting down (its peers are gone)."""
import os
import signal
import sys
import time

import numpy as np
import torch

from gpu_common import DEVICE
import commlib
import commlib.torch as hvd
from _common import done, expect_raises, fail

hvd.init()
r, n = hvd.rank(), hvd.size()
T = float(os.environ["COMMLIB_TIMEOUT"])
case = sys.argv[1]
pids = commlib.allgather(np.array([os.getpid()]), name="pids")
x = torch.ones(1 << 20, device=DEVICE)
hvd.allreduce_(x, op=hvd.Sum, name="warm-up")  # the communicator exists
last = r == n - 1

if last and case == "sleeps":
    time.sleep(T + 25)  # (never submits; then leaves)
    os._exit(0)
if case == "frozen":
    if last:  # submits first; frozen by rank 0 after the barrier, inside the collective
        h = hvd.allreduce_async_(x, op=hvd.Sum, name="stuck")
        commlib.barrier()
        time.sleep(T + 25)  # (resumed after the others failed: its peers are gone)
        os._exit(0)
    commlib.barrier()
    if r == 0:
        os.kill(int(pids[n - 1]), signal.SIGSTOP)
start = time.monotonic()
e = expect_raises(commlib.CollectiveTimeoutError, lambda: hvd.allreduce_(x, op=hvd.Sum, name="stuck"),
                  f"{case}: allreduce with rank {n - 1} stopped")
took = time.monotonic() - start
if took > T + 10:
    fail(f"the timeout error took {took:.1f} s (COMMLIB_TIMEOUT {T:.0f} s)")
if "'stuck'" not in str(e) or str(n - 1) not in str(e):
    fail(f"the error does not name the tensor and rank {n - 1}: {e}")
if r == 0 and case == "frozen":
    os.kill(int(pids[n - 1]), signal.SIGCONT)
print(f"rank {r}: {case}: {e}", flush=True)
done()
os._exit(0)  # (the communicator was aborted; the job ends without a collective shutdown)

"""Run by tests/gpu with COMMLIB_TIMEOUT set: the last rank stops taking part
and the others' CUDA allreduce fails with CollectiveTimeoutError within the
timeout + 10 s. argv[1]: sleeps (it never submits: the negotiation times out
and names it) or frozen (it submits, then rank 0 stops it with SIGSTOP inside
the NCCL collective: the GPU-side timeout aborts the communicator). Then every
rank goes on: the stopped rank's own collective fails (its peers aborted, and
it made no progress for longer than the timeout), a new communicator replaces
the aborted one, and the job shuts down normally. The same steps run on CPU
against the GPU emulator (workers/gpu_emulated.py), where an earlier form of
this script, whose ranks left with os._exit, made mpiexec kill the job."""
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
    time.sleep(T + 3)  # (never submits 'stuck')
elif last:
    h = hvd.allreduce_async_(x, op=hvd.Sum, name="stuck")
    commlib.barrier()
    time.sleep(1)  # (stopped in here by rank 0, and resumed after the others failed)
    expect_raises(commlib.CommlibError, lambda: hvd.synchronize(h), "the stopped rank's collective")
else:
    if case == "frozen":
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
y = torch.full((1000,), float(r), device=DEVICE)
hvd.allreduce_(y, op=hvd.Sum, name="works")
if not torch.equal(y.cpu(), torch.full((1000,), float(sum(range(n))))):
    fail(f"the allreduce after the timeout gave {y[:4].tolist()}")
done()
hvd.shutdown()

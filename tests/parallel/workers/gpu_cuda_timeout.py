"""Run by tests/gpu with COMMLIB_TIMEOUT set: the last rank stops taking part
and the others' CUDA allreduce fails with CollectiveTimeoutError within the
timeout + 10 s. argv[1]: sleeps (it never submits: the negotiation times out
and names it) or frozen (it submits, then rank 0 stops it with SIGSTOP inside
the NCCL collective: the GPU-side timeout aborts the communicator; with
COMMLIB_CUDA_SYNC=stream, the default, the error comes from the next
synchronize, since synchronize returned once the collective was launched). Then every
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
import commlib.gpu
import commlib.torch as hvd
from _common import done, expect_raises, fail, stop_process

hvd.init()
r, n = hvd.rank(), hvd.size()
T = float(os.environ["COMMLIB_TIMEOUT"])
case = sys.argv[1]
pids = commlib.allgather(np.array([os.getpid()]), name="pids")
x = torch.ones(1 << 20, device=DEVICE)
hvd.allreduce_(x, op=hvd.Sum, name="warm-up")  # the communicator exists
# With COMMLIB_CUDA_SYNC=stream the warm-up may still run on the device (NCCL
# connects its peers in the first collective); a rank frozen then stops the
# warm-up, which then (rightly) is the collective that times out. The first
# GPU run found this.
torch.cuda.current_stream().synchronize()
last = r == n - 1

if last and case == "sleeps":
    time.sleep(T + 3)  # (never submits 'stuck')
elif last:
    h = hvd.allreduce_async_(x, op=hvd.Sum, name="stuck")
    commlib.barrier()
    time.sleep(1)  # (stopped in here by rank 0, and resumed after the others failed)
    if commlib.gpu.sync_mode() == "stream":
        # synchronize raises if this rank's engine saw the failure already;
        # else it returns at the launch and the next synchronize raises (a
        # 2-rank GPU run took that turn)
        try:
            hvd.synchronize(h)
        except commlib.CommlibError:
            commlib.barrier()  # (the others' next synchronize, which raises there)
        else:
            torch.cuda.current_stream().synchronize()  # (until the communicator fails here too)
            expect_raises(commlib.CommlibError, commlib.barrier, "the stopped rank's next synchronize")
    else:
        expect_raises(commlib.CommlibError, lambda: hvd.synchronize(h), "the stopped rank's collective")
else:
    if case == "frozen":
        commlib.barrier()
        if r == 0:
            stop_process(int(pids[n - 1]))
    start = time.monotonic()
    if case == "frozen" and commlib.gpu.sync_mode() == "stream":
        # synchronize returns once the collective is launched; the current
        # stream waits for it on the device until the communicator is aborted,
        # and the next synchronize raises the error
        hvd.allreduce_(x, op=hvd.Sum, name="stuck")
        torch.cuda.current_stream().synchronize()
        time.sleep(0.5)
        if r == 0:
            os.kill(int(pids[n - 1]), signal.SIGCONT)
        e = expect_raises(commlib.CollectiveTimeoutError, commlib.barrier,
                          "the synchronize after a collective that failed on the device")
    else:
        e = expect_raises(commlib.CollectiveTimeoutError, lambda: hvd.allreduce_(x, op=hvd.Sum, name="stuck"),
                          f"{case}: allreduce with rank {n - 1} stopped")
    took = time.monotonic() - start
    if took > T + 10:
        fail(f"the timeout error took {took:.1f} s (COMMLIB_TIMEOUT {T:.0f} s)")
    if "'stuck'" not in str(e) or str(n - 1) not in str(e):
        fail(f"the error does not name the tensor and rank {n - 1}: {e}")
    if r == 0 and case == "frozen" and commlib.gpu.sync_mode() == "host":
        os.kill(int(pids[n - 1]), signal.SIGCONT)
    print(f"rank {r}: {case}: {e}", flush=True)
y = torch.full((1000,), float(r), device=DEVICE)
hvd.allreduce_(y, op=hvd.Sum, name="works")
if not torch.equal(y.cpu(), torch.full((1000,), float(sum(range(n))))):
    fail(f"the allreduce after the timeout gave {y[:4].tolist()}")
done()
hvd.shutdown()

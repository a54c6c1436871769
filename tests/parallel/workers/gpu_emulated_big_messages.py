"""Run by tests/parallel/test_gpu_emulated.py (test_responses_above_the_eager_size):
broadcast_parameters of a ResNet-50-sized state_dict on the NCCL executor,
then the first allreduce of its gradients, where the control messages that
negotiate them (320 long names each) are far above MPI's eager size and a
launch blocks the engine's thread outside MPI: ncclCommInitRank waits for
the other members, and (COMMLIB_GPU_EMULATOR_CONNECT=1, as NCCL 2.22 on) a
communicator's first collective of each kind waits until every member has
issued one. Run with MPI made to move such messages only while their sender
calls into MPI (no single copy, small eager cells). Before the fixes this
hung forever: rank 0 waited in the launch, the others for the rest of rank
0's response (the ResNet-50 hang of the GPU machine's check).

Every rank checks every result against numpy; argv[1] the number of tensors."""
import ctypes
import os
import sys

import numpy as np

import commlib
from commlib import device_ops
from commlib._lib import lib
from commlib.device_ops import DeviceBuffer
from commlib.dtypes import dtype_code
from commlib.handle import synchronize_on_stream
from _common import check_equal, done

commlib.init()
r, n = commlib.rank(), commlib.size()
count = int(sys.argv[1])
EMULATOR = ctypes.CDLL(os.environ["COMMLIB_NCCL_LIBRARY"])


def name_of(i: int, what: str) -> str:
    """A name as long as a deep model's parameter names."""
    return f"module.layer{i // 24}.{i % 24}.downsample.1.running_var.{what}.{i:04d}"


def submitted_together(op_type, what: str, **kw):
    """count tensors of op_type submitted at once, then each synchronized on
    the caller's stream (as broadcast_parameters and step() do); the results
    after the stream has run everything."""
    ins = [np.full(64 + i % 7, float(1000 * r + i), np.float32) for i in range(count)]
    outs = [np.full_like(x, -1.0) for x in ins]
    handles = [device_ops.submit(op_type, name_of(i, what), DeviceBuffer(x.ctypes.data, dtype_code(x.dtype), x.shape),
                                 o.ctypes.data, device=0, stream=0, keepalive=(x, o), value=o, **kw)
               for i, (x, o) in enumerate(zip(ins, outs))]
    for h in handles:
        synchronize_on_stream(h, 0)
    EMULATOR.cudaStreamSynchronize(ctypes.c_void_p(0))
    return outs


got = submitted_together(lib.COMMLIB_OP_BROADCAST, "state", root=0)
for i, o in enumerate(got):
    check_equal(o, np.full(64 + i % 7, float(i), np.float32), f"broadcast {name_of(i, 'state')}")
got = submitted_together(lib.COMMLIB_OP_ALLREDUCE, "grad", reduce_op=commlib.Sum)
for i, o in enumerate(got):
    want = np.full(64 + i % 7, float(sum(1000 * q + i for q in range(n))), np.float32)
    check_equal(o, want, f"allreduce {name_of(i, 'grad')}")
print(f"rank {r}: {count} broadcasts and {count} allreduces with long names: ok", flush=True)
done()
commlib.shutdown()

"""Collectives on device (CUDA) buffers, framework-free: buffers are raw
device pointers (ints), the stream is the caller's CUDA stream handle (int;
0 is the legacy default stream).

The core runs them through NCCL (csrc/exec/gpu_executor.h): its own stream
waits on an event recorded on ``stream`` at submission, and the handle
completes once the NCCL work has finished on the device. Frontends turn
tensors into these arguments (commlib.torch: frontends/torch/cuda_nccl.py);
where NCCL cannot run they stage through host memory instead (commlib.gpu).

``synchronize(handle)`` waits on the host until the result is in place;
``synchronize_on_stream(handle, stream)`` waits only until the collective is
launched and makes the caller's stream wait for it on the device.

Allgather and alltoall write into an ``output`` the caller allocated with
``output_rows`` rows (the caller learns the rows first, e.g. with a small
host allgather of every rank's dim 0).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

from . import gpu
from ._lib import lib
from .handle import Handle, synchronize_on_stream
from .submit import address, again_in_place, request
from .submit import submit as submit_request

__all__ = ["DeviceBuffer", "OPS", "build", "submit", "submit_built", "synchronize_on_stream"]

# The collectives on device buffers: name -> the core's op code (``submit``'s ``op_type``).
OPS = {"allreduce": lib.COMMLIB_OP_ALLREDUCE, "allgather": lib.COMMLIB_OP_ALLGATHER,
       "broadcast": lib.COMMLIB_OP_BROADCAST, "alltoall": lib.COMMLIB_OP_ALLTOALL,
       "reducescatter": lib.COMMLIB_OP_REDUCESCATTER}
_OP_NAMES = {code: name for name, code in OPS.items()}

_loaded = []


def ensure_loaded() -> None:
    """The core finds NCCL through the wheel's path, which only Python knows."""
    if not _loaded:
        gpu.load()
        _loaded.append(True)


class DeviceBuffer(NamedTuple):
    ptr: int                 # device address (0 for an empty buffer)
    dtype: int               # COMMLIB_* dtype code (commlib.dtypes)
    shape: tuple


def submit(op_type: int, name: str, inp: DeviceBuffer, out_ptr: int, *, device: int, stream: int,
           reduce_op: int = 0, prescale: float = 1.0, postscale: float = 1.0, root: int = 0,
           splits: Sequence[int] | None = None, output_rows: int = -1, process_set: int = 0,
           keepalive=None, value=None) -> Handle:
    """Submits one collective on device buffers (``op_type``: a value of
    ``OPS``); the returned Handle's result
    is ``value``. ``keepalive`` (the framework tensors) stays referenced until
    the handle completes. Errors the core finds before anything is queued (no
    NCCL, no CUDA runtime, COMMLIB_GPU_BACKEND=host, a dtype or op NCCL cannot
    run) raise here, on every rank alike."""
    r = build(op_type, name, inp, out_ptr, device=device, stream=stream, reduce_op=reduce_op, prescale=prescale,
              postscale=postscale, root=root, splits=splits, output_rows=output_rows, process_set=process_set)
    return submit_built(r, op_type, keepalive, value, device)


def build(op_type: int, name: str, inp: DeviceBuffer, out_ptr: int, *, device: int, stream: int,
          reduce_op: int = 0, prescale: float = 1.0, postscale: float = 1.0, root: int = 0,
          splits: Sequence[int] | None = None, output_rows: int = -1, process_set: int = 0):
    """The request ``submit`` submits (commlib.submit.Request), for a caller
    that submits the same call again (``submit_built``)."""
    ensure_loaded()
    return request(
        op_type, name, shape=tuple(inp.shape), dtype=inp.dtype, input=address(inp.ptr),
        output=address(out_ptr), reduce_op=reduce_op, prescale=prescale, postscale=postscale,
        root=root, splits=splits, process_set=process_set, device_type=lib.COMMLIB_DEVICE_CUDA,
        device_id=device, stream=address(stream), output_rows=output_rows)


def submit_built(r, op_type: int, keepalive, value, device: int, buffer: int | None = None) -> Handle:
    """Submits a request ``build`` made (again: the core copies what it
    keeps). ``buffer``: the device address it now reads and writes, in place
    (set under a lock: another thread may submit the same request)."""
    hid = submit_request(r) if buffer is None else again_in_place(r, address(buffer))
    return Handle(hid, None, keepalive, _OP_NAMES.get(op_type, "collective"), value=value,
                  device=device)


"""CUDA tensors through NCCL in the core (commlib.device_ops): the tensor's
device pointer, its device and the caller's current stream go to the core,
whose own stream waits on an event recorded on that stream; the handle
completes once NCCL finished on the device. Outputs are allocated here, on
the tensor's device (allgather/alltoall first learn every rank's rows with a
small host collective). Arguments were checked by the caller
(cuda_dispatch); each function returns a Handle like the CPU forms'.
"""
from __future__ import annotations

import numpy as np
import torch

import commlib as _c
from commlib import device_ops, gpu
from commlib.device_ops import OPS
from commlib.ops import Adasum, Average, Max, Min, Product, auto_name, reducescatter_rows
from commlib.process_sets import set_rank
from commlib.refusals import refused_members

from ..collectives.handles import Handle
from ..collectives.tensor_io import core_code

# What NCCL reduces natively: no 16-bit integers or bools; Average and scale
# factors on floating-point data only, scale factors with Sum/Average only.
_NCCL_REDUCIBLE = {torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                   torch.float32, torch.float64}
_FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}


def can_reduce(dtype: torch.dtype, op: int, prescale: float, postscale: float) -> bool:
    """Whether the NCCL executor runs this reduction (else it is staged)."""
    scaled = prescale != 1.0 or postscale != 1.0
    if op == Adasum or dtype not in _NCCL_REDUCIBLE:  # (Adasum: the core's host algorithm)
        return False
    if (scaled or op == Average) and dtype not in _FLOATS:
        return False
    return not (scaled and op in (Min, Max, Product))


def _buffer(t: torch.Tensor) -> device_ops.DeviceBuffer:
    """The core's view of a CUDA tensor. Its dtype code comes from torch's
    dtype directly (numpy knows no bfloat16 unless ml_dtypes was imported:
    the first GPU run failed there)."""
    shape = tuple(t.shape) or (1,)
    code = core_code(t.dtype)
    if code is None:
        raise TypeError(f"unsupported dtype {t.dtype} for a CUDA collective")
    return device_ops.DeviceBuffer(t.data_ptr() if t.numel() else 0, code, shape)


def _stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream


def _submit(op_type, name, t, out, keep, value, **kw) -> Handle:
    h = device_ops.submit(op_type, name, _buffer(t), out.data_ptr() if out is not None and out.numel() else 0,
                          device=t.device.index, stream=_stream(t), keepalive=keep, value=value, **kw)
    return Handle(h, _result, keep)


def _result(r):
    return r


def allreduce(tensor, output, name, op, prescale, postscale, ps) -> Handle:
    t = tensor.contiguous()
    out = output if output is not None else torch.empty_like(t)
    kw = dict(reduce_op=op, prescale=prescale, postscale=postscale, process_set=ps.process_set_id)
    if out is not tensor or type(name) is not str or ps.process_set_id != 0 or not t.numel():
        return _submit(OPS["allreduce"], auto_name("allreduce", name, ps), t, out, (t, out),
                       out if out is tensor else out.view(tensor.shape), **kw)
    # in place, named, on the global set: remembered for allreduce_again
    stream = _stream(t)
    r = device_ops.build(OPS["allreduce"], auto_name("allreduce", name), _buffer(t), t.data_ptr(),
                         device=t.device.index, stream=stream, **kw)
    h = device_ops.submit_built(r, OPS["allreduce"], (t, t), t, t.device.index)
    if len(_again) >= _AGAIN_LIMIT:
        _again.clear()
    _again[name] = [t.data_ptr(), t.dtype, t.shape, (op, prescale, postscale), r, stream, t.device]
    return Handle(h, _result, (t, t))


# A training loop's in-place allreduces of CUDA tensors under the same names
# (the gradients, from DistributedOptimizer's hooks) submit again the request
# the first such call of a name built, while the call's arguments, the
# current stream and the tensor's dtype, shape and device are that call's: the
# checks, the routing and building the request cost ~30 us of Python per
# gradient, on the thread that launches the backward pass's kernels. By name,
# not by tensor: zero_grad() makes new gradient tensors every step (their
# storage, mostly the same blocks again, is set in the request when it moved).
# name -> [data address, dtype, shape, (op, prescale, postscale), the Request,
# stream, device].
_again: dict = {}
_AGAIN_LIMIT = 8192
_STRIDED = torch.strided


def allreduce_again(tensor, name, op, prescale, postscale):
    """The Handle of ``allreduce_async_(tensor, name=name, op=op, ...)`` on
    the global set when it repeats such a call of that name (see ``_again``),
    submitted as that one was; None otherwise (the caller takes the checked
    way)."""
    q = _again.get(name)
    if q is None:
        return None
    ptr, dtype, shape, args, r, stream, device = q
    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        return None
    if (args != (Average if op is None else op, prescale, postscale) or tensor.layout is not _STRIDED
            or tensor.dtype is not dtype or tensor.shape != shape or tensor.device != device
            or not tensor.is_contiguous() or torch.cuda.current_stream(device).cuda_stream != stream
            or gpu.cuda_path() != "nccl"):
        return None
    keep = (tensor, tensor)
    now = tensor.data_ptr()
    h = device_ops.submit_built(r, OPS["allreduce"], keep, tensor, device.index, buffer=None if now == ptr else now)
    q[0] = now
    return Handle(h, _result, keep)


def grouped_allreduce(tensors, outputs, name, op, prescale, postscale, ps) -> Handle:
    """One allreduce ``<base>.<i>`` per tensor (``base``: the call's name,
    generated first); a member refused here is told to the others for it
    and every later member (commlib.refusals.refused_members)."""
    base = auto_name("grouped_allreduce", name, ps)
    members = []
    try:
        for i, (t, o) in enumerate(zip(tensors, outputs)):
            members.append(allreduce(t, o, f"{base}.{i}", op, prescale, postscale, ps))
    except (TypeError, ValueError) as e:
        refused_members(e, "allreduce", base, len(members), len(tensors), ps)
        raise
    return Handle.of_group(members, list, members)


def broadcast(tensor, output, root_rank, name, ps) -> Handle:
    t = tensor.contiguous()
    out = output if output is not None else torch.empty_like(t)
    return _submit(OPS["broadcast"], auto_name("broadcast", name, ps), t, out, (t, out), out,
                   root=root_rank, process_set=ps.process_set_id)


def _every_ranks(values, name, ps) -> np.ndarray:
    """Every rank's values, one row per rank of the set (a host allgather)."""
    return _c.allgather(np.asarray([values], dtype=np.int64), name=name + ".rows", process_set=ps)


def allgather(tensor, name, ps) -> Handle:
    t = tensor.contiguous()
    name = auto_name("allgather", name, ps)
    rows = int(_every_ranks([t.shape[0]], name, ps)[:, 0].sum())
    out = torch.empty((rows,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    return _submit(OPS["allgather"], name, t, out, (t, out), out, output_rows=rows,
                   process_set=ps.process_set_id)


def alltoall(tensor, send_splits, name, ps) -> Handle:
    t = tensor.contiguous()
    name = auto_name("alltoall", name, ps)
    received = _every_ranks(list(send_splits), name, ps)[:, set_rank(ps)]
    rows = int(received.sum())
    out = torch.empty((rows,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    value = (out, torch.from_numpy(received.astype(np.int32)))
    return _submit(OPS["alltoall"], name, t, out, (t, out), value, splits=list(send_splits),
                   output_rows=rows, process_set=ps.process_set_id)


def reducescatter(tensor, name, op, prescale, postscale, ps) -> Handle:
    t = tensor.contiguous()
    rows = reducescatter_rows(t.shape[0], ps)
    out = torch.empty((rows,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    return _submit(OPS["reducescatter"], auto_name("reducescatter", name, ps), t, out, (t, out), out,
                   reduce_op=op, prescale=prescale, postscale=postscale, process_set=ps.process_set_id)

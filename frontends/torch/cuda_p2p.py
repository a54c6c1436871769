"""Point-to-point on CUDA tensors through NCCL (commlib.device_p2p), for
frontends/torch/p2p.py.

A send of a CUDA tensor hands the core its device pointer and the current
stream: the core's link waits on the device for the kernels queued before
the send, and the handle completes once the data reached the receiver. A
receive in a process that can use NCCL first matches the message like any
receive; a device message is then received straight into device memory (a
CUDA ``out``, or a new tensor on ``device`` or the current CUDA device,
moved to the host when the caller asked for a host tensor), while a host
message is received as before. So senders and receivers may mix host and
CUDA tensors freely. An ``irecv`` of a device message moves the data in
``synchronize`` (``poll`` turns true once the message has been matched), and
its sender's ``isend`` completes only then.

The seams (which tensors take this path, the device, the stream) are
functions here so that the same steps run on CPU tensors against the GPU
emulator (tests/parallel/workers/torch_p2p_emulated.py).
"""
from __future__ import annotations

import torch

from commlib import device_p2p, gpu
from commlib.handle import synchronize

from .handles import Handle
from .tensor_io import check_tensor, core_code, torch_dtype


def is_nccl_tensor(t) -> bool:
    """Whether a send of ``t`` runs through NCCL (a CUDA tensor, NCCL usable)."""
    return isinstance(t, torch.Tensor) and t.device.type == "cuda" and gpu.cuda_path() == "nccl"


_claims: list = []


def claiming() -> bool:
    """Whether this process's receives take device messages (CUDA and NCCL usable)."""
    if not _claims:
        _claims.append(torch.cuda.is_available() and gpu.cuda_path() == "nccl")
    return _claims[0]


def device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def stream_of(device: torch.device) -> int:
    """The current stream of ``device`` (a CUDA stream handle)."""
    return torch.cuda.current_stream(device).cuda_stream


def receive_device(out, device) -> torch.device:
    """Where a device message lands first: out's device, a CUDA ``device``, or the current CUDA device."""
    if out is not None and out.device.type == "cuda":
        return out.device
    if device is not None and torch.device(device).type == "cuda":
        return torch.device(device)
    return torch.device("cuda", torch.cuda.current_device())


def isend(tensor, dst, tag, process_set) -> Handle:
    t = check_tensor(tensor, "isend").detach().contiguous()
    h = device_p2p.isend_device(t.data_ptr() if t.numel() else 0, core_code(t.dtype), tuple(t.shape), dst, tag,
                                process_set, device=device_index(t.device), stream=stream_of(t.device), keepalive=t)
    return Handle(h, lambda _none: None, (tensor, t))


def irecv(src, tag, out, process_set, device, host_view, to_tensor) -> Handle:
    """A receive that takes host and device messages. host_view(out): the
    numpy view of a host ``out``; to_tensor(array, device): a host message as
    a tensor on ``device`` (None: the CPU)."""
    arr, code, shape = None, -1, None
    if device is not None and out is None:
        check_tensor(torch.empty(0, device=device), "irecv")  # (a device commlib can reach)
    if out is not None:
        if device is not None:
            raise ValueError("irecv: pass either out= or device=, not both (out's device is used)")
        check_tensor(out, "irecv", inplace=True)
        if out.device.type == "cpu":
            arr = host_view(out)
        else:
            code, shape = core_code(out.dtype), tuple(out.shape)
    core = device_p2p.irecv_or_claim(src, tag, out=arr, process_set=process_set, dtype=code, shape=shape)

    def finish(got):
        if isinstance(got, device_p2p.Claimed):
            return _take(got, out, device)
        if out is None:
            return to_tensor(got, device)
        if arr is None:  # (a host message into a device out)
            out.copy_(to_tensor(got, None).view(out.shape))
        return out
    return Handle(core, finish, (out, arr))


def _take(claimed, out, device):
    """Receives a claimed device message into out, or a new tensor on device."""
    on = receive_device(out, device)
    direct = out is not None and out.device == on and out.is_contiguous()
    buf = out if direct else torch.empty(claimed.shape, dtype=torch_dtype(claimed.dtype), device=on)
    synchronize(device_p2p.irecv_claimed(claimed, buf.data_ptr() if buf.numel() else 0, device=device_index(on),
                                         stream=stream_of(on), keepalive=buf))
    if out is None:
        return buf.to(device if device is not None else "cpu")
    if not direct:
        out.copy_(buf.view(out.shape))
    return out


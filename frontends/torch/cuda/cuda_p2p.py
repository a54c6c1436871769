"""Point-to-point on CUDA tensors through NCCL (commlib.device_p2p), for
frontends/torch/collectives/p2p.py.

A send of a CUDA tensor hands the core its device pointer and the current
stream: the core's link waits on the device for the kernels queued before
the send, and the handle completes once the data reached the receiver. A
receive in a process that can use NCCL names the CUDA device device messages
land on (a CUDA ``out``'s, a CUDA ``device``, or the current one): into a
CUDA ``out`` directly, else into device memory the core allocates, copied
into a new tensor (or a host ``out``) on the current stream when the handle
is synchronized; a host message is received as before. So senders and
receivers may mix host and CUDA tensors freely, and both ends progress in
the background (an ``irecv`` moves its data before it is synchronized).

The seams (which tensors take this path, the device, the stream) are
functions here so that the same steps run on CPU tensors against the GPU
emulator (tests/parallel/workers/torch_p2p_cuda_paths.py).
"""
from __future__ import annotations

import torch

from commlib import device_p2p, gpu

from ..collectives.handles import Handle
from ..collectives.tensor_io import check_receive_target, check_tensor, core_code, torch_dtype


def is_nccl_tensor(t) -> bool:
    """Whether a send of ``t`` runs through NCCL (a CUDA tensor, NCCL usable)."""
    return isinstance(t, torch.Tensor) and t.device.type == "cuda" and gpu.cuda_path() == "nccl"


_takes: list = []


def takes_device_messages() -> bool:
    """Whether this process's receives take device messages (CUDA and NCCL usable)."""
    if not _takes:
        _takes.append(torch.cuda.is_available() and gpu.cuda_path() == "nccl")
    return _takes[0]


def is_device_out(t: torch.Tensor) -> bool:
    """Whether a receive's ``out`` is device memory the message can land in."""
    return t.device.type == "cuda"


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


def copied(device: torch.device) -> None:
    """Called after a copy out of the core's device memory was queued on
    ``device``'s current stream: nothing to do for CUDA tensors (later work
    on the stream, and torch's host reads, are ordered after it)."""


def irecv(src, tag, out, process_set, device, what, host_view, to_tensor) -> Handle:
    """A receive that takes host and device messages. host_view(out): the
    numpy view of a host ``out``; to_tensor(array, device): a host message as
    a tensor on ``device`` (None: the CPU)."""
    device = check_receive_target(out, device, what)
    arr = None
    on_device = out is not None and is_device_out(out)
    if out is not None and not on_device:
        arr = host_view(out)
    on = receive_device(out, device)
    kw = {}
    if on_device:
        kw = {"device_out": out.data_ptr() if out.numel() else 0, "dtype": core_code(out.dtype),
              "shape": tuple(out.shape), "keepalive": out}
    core = device_p2p.irecv_device(src, tag, process_set, device=device_index(on), stream=stream_of(on),
                                   host_out=arr, **kw)

    def finish(got):
        if isinstance(got, device_p2p.DeviceMessage):
            buf = torch.empty(got.shape, dtype=torch_dtype(got.dtype), device=on)
            device_p2p.release(got, buf.data_ptr() if buf.numel() else 0, stream=stream_of(on))
            copied(on)
            if out is not None:
                out.copy_(buf.view(out.shape))
                return out
            return buf.to(device if device is not None else "cpu")
        if out is None:
            return to_tensor(got, device)
        if on_device and got is not None:  # (a host message into a CUDA out)
            out.copy_(to_tensor(got, None).view(out.shape))
        return out
    return Handle(core, finish, (out, arr))

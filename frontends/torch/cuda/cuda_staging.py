"""CUDA tensors through host memory: the path CUDA tensors take without
NCCL (or with COMMLIB_GPU_BACKEND=host, or for what NCCL cannot reduce).

A collective's CUDA tensors are copied into pinned host tensors (page-locked
when CUDA is there, so the copies run at full PCIe speed), the CPU path runs on
those, and the handle's result goes back to the device: written into the
caller's tensor for in-place forms, moved to the tensor's device otherwise.
The copy to the host waits for the caller's stream (``copy_`` is ordered on
it), so the data is the one the caller's kernels produced.

Nothing here is specific to CUDA: the same steps run for any device, which is
how it is tested on machines without a GPU (tests/parallel/test_torch_cuda_cpu.py).
"""
from __future__ import annotations

import torch

from ..collectives.handles import Handle


def _pinned() -> bool:
    return torch.cuda.is_available()


def stage_in(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous host copy of ``tensor`` (pinned when CUDA is available).
    It is a copy even for a CPU tensor: the collective never sees the caller's memory."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=_pinned())
    host.copy_(tensor.detach())
    return host


def host_buffer(like: torch.Tensor) -> torch.Tensor:
    """An empty host tensor of ``like``'s shape and dtype (pinned when CUDA is
    available): where a result for ``like`` lands before it goes to the device."""
    return torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=_pinned())


def to_device(result, device: torch.device):
    """``result`` (a tensor, or a list/tuple of them) on ``device``."""
    if isinstance(result, torch.Tensor):
        return result.to(device)
    if isinstance(result, (list, tuple)):
        return type(result)(to_device(r, device) for r in result)
    return result


def staged_call(call, tensors, inplace: bool, keep_on_host: int | None = None) -> Handle:
    """Runs the CPU collective ``call(staged)`` on host copies of ``tensors``
    (one tensor, or a list for grouped forms) and returns a Handle whose
    result is on the tensors' device: for ``inplace`` forms the result is
    copied into the caller's tensors (which are returned). ``keep_on_host``:
    index of a tuple result left on the host (alltoall's received splits)."""
    group = isinstance(tensors, (list, tuple))
    originals = list(tensors) if group else [tensors]
    hosts = [stage_in(t) for t in originals]
    inner = call(hosts if group else hosts[0])
    device = originals[0].device if originals else torch.device("cpu")

    def finish(result):
        if inplace:
            for original, host in zip(originals, hosts):
                original.copy_(host)
            return list(originals) if group else originals[0]
        if keep_on_host is not None and isinstance(result, tuple):
            return tuple(r if i == keep_on_host else to_device(r, device) for i, r in enumerate(result))
        return to_device(result, device)

    # (in-place forms may hand back the core's handle itself, whose result is final)
    if isinstance(inner, Handle):
        return inner.then(finish, (originals, hosts))
    return Handle(inner, finish, (originals, hosts))

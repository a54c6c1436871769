"""Handles of commlib.torch's asynchronous collectives: ``poll`` and
``synchronize`` (which turns the core's results into tensors)."""
from __future__ import annotations

import commlib as _c
from commlib import gpu
from commlib.handle import Handle as _CoreHandle
from commlib.handle import synchronize_on_stream


class Handle:
    """An in-flight collective on torch tensors; pass it to ``poll`` or
    ``synchronize``. It keeps the tensors involved alive until then."""

    __slots__ = ("_handles", "_finish", "_keep")

    def __init__(self, handles, finish, keep=None):
        self._handles = handles  # one commlib.Handle or a list of them
        self._finish = finish  # core result(s) -> torch result
        self._keep = keep

    def __repr__(self):
        return f"<commlib.torch.Handle {self._handles!r}>"

    def then(self, after, keep=None) -> "Handle":
        """A handle on the same collective whose result is ``after(result)``
        (this handle's result); it keeps ``keep`` alive too."""
        finish = self._finish
        return Handle(self._handles, lambda results: after(finish(results)), (self._keep, keep))

    @classmethod
    def of_group(cls, handles, finish, keep=None):
        """One handle over several (one per member of a group): handles of
        this class, or the core's own."""
        return cls([h if isinstance(h, _CoreHandle) else h._handles for h in handles], finish, keep)


class CallableHandle(Handle):
    """A Handle that is also called to wait for its result, as the handle
    Horovod's ``sparse_allreduce_async`` returns: ``handle()`` is
    ``synchronize(handle)``."""

    __slots__ = ()

    def __call__(self):
        return synchronize(self)


def _core_handles(handle):
    """The commlib.Handle (or list of them) behind ``handle``."""
    if isinstance(handle, _c.Handle):
        return handle
    if not isinstance(handle, Handle):
        raise TypeError(f"expected a handle from an *_async call, got {type(handle).__name__}")
    return handle._handles


def poll(handle) -> bool:
    """True when the collective has completed (``synchronize`` will not block)."""
    hs = _core_handles(handle)
    if isinstance(hs, list):
        return all(_c.poll(h) for h in hs)
    return _c.poll(hs)


def _wait(h):
    """One core handle's result. A CUDA collective through NCCL, with
    COMMLIB_CUDA_SYNC=stream (the default): once it is launched, the current
    stream of its device waits for it on the device, and the host goes on."""
    if h.device is None or gpu.sync_mode() == "host":
        return _c.synchronize(h)
    import torch

    return synchronize_on_stream(h, torch.cuda.current_stream(h.device).cuda_stream)


def synchronize(handle):
    """Waits for an asynchronous collective and returns its result: the output
    tensor (the input tensor itself for in-place forms), a list for grouped
    forms, ``(output, received_splits)`` for alltoall. For CUDA tensors
    through NCCL (COMMLIB_CUDA_SYNC=stream, the default) the host waits only
    until the collective is launched: the caller's current stream waits for
    it on the device, so work queued on that stream afterwards sees the
    result."""
    if type(handle) is _CoreHandle and handle.device is None:  # (a host collective's own handle)
        return _c.synchronize(handle)
    hs = _core_handles(handle)
    if hs is handle:
        return _wait(handle)
    if isinstance(hs, list):
        results, first_error = [], None
        for h in hs:  # wait for every member even if one fails
            try:
                results.append(_wait(h))
            except Exception as e:  # noqa: BLE001 - re-raised below
                results.append(None)
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return handle._finish(results)
    return handle._finish(_wait(hs))

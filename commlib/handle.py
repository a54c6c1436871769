"""Handles of asynchronous collectives: poll(handle) and synchronize(handle)."""
from __future__ import annotations

from typing import Any, Callable

from ._lib import error_for, ffi, last_error, lib

# Arrays the core may still read or write, by handle id. A handle dropped
# before completion keeps its buffers alive here until it completes, so the
# core never touches freed memory.
_keepalive: dict[int, Any] = {}

WAIT_SLICE_S = 0.2  # wait in slices so that Ctrl-C reaches Python
_c_wait_status = lib.commlib_wait_status
_OK = lib.COMMLIB_OK
_TIMEOUT = lib.COMMLIB_ERR_TIMEOUT


class Handle:
    """An in-flight collective. Pass it to ``synchronize`` for the result.
    ``device``: the CUDA device of a collective on device buffers, else None."""

    __slots__ = ("_id", "_finish", "_result", "_done", "_error", "op", "device")

    def __init__(self, hid: int, finish: Callable[[int], Any] | None, keepalive: Any, op: str,
                 value: Any = None, device: int | None = None):
        """``finish(hid)`` builds the result from what the core holds (an
        allgather's rows, a message's shape); without it the result is
        ``value``, known when the request was submitted (the output array)."""
        self._id = hid
        self._finish = finish
        self._result = value
        self._done = False
        self._error = None  # the error it raised (raised again by a later synchronize)
        self.op = op
        self.device = device
        _keepalive[hid] = keepalive

    def __repr__(self) -> str:
        state = "synchronized" if self._done else ("ready" if poll(self) else "pending")
        return f"<commlib.Handle {self.op} #{self._id} {state}>"


def poll(handle: Handle) -> bool:
    """True when the collective has completed (synchronize will not block)."""
    if not isinstance(handle, Handle):
        raise TypeError(f"expected a commlib Handle, got {type(handle).__name__}")
    return handle._done or bool(lib.commlib_poll(handle._id))


def synchronize(handle: Handle):
    """Waits for the collective (the GIL is released while waiting) and returns
    its result, or raises its error. A handle can be synchronized once; one
    that failed raises its error again (so a caller that kept it, like a
    delayed average, cannot mistake it for a result later)."""
    if not isinstance(handle, Handle):
        raise TypeError(f"expected a commlib Handle, got {type(handle).__name__}")
    if handle._done:
        if handle._error is not None:
            raise handle._error
        raise ValueError("this handle has already been synchronized")
    hid = handle._id
    finish = handle._finish
    if type(finish) is TakesResult:
        return _take_result(handle, hid, finish.make)
    # One core call waits, reads the status and, when nothing else is needed
    # from the core, releases the handle.
    rc = _c_wait_status(hid, WAIT_SLICE_S, finish is None)
    while rc == _TIMEOUT:
        rc = _c_wait_status(hid, WAIT_SLICE_S, finish is None)
    handle._done = True
    if finish is None:
        _keepalive.pop(hid, None)
        if rc != _OK:
            handle._error = error_for(rc, last_error())
            raise handle._error
        return handle._result
    try:
        if rc != _OK:
            handle._error = error_for(rc, last_error())
            raise handle._error
        return finish(hid)
    finally:
        lib.commlib_release(hid)
        _keepalive.pop(hid, None)


class TakesResult:
    """A handle's finish that makes its result from the result bytes the
    core allocated (an allgather's, an alltoall's without splits):
    ``make(data, rows)``, data the bytes (now owned by Python), rows the
    result's dimension 0. ``synchronize`` waits for them, takes them and
    releases the handle in one core call."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[Any, int], Any]):
        self.make = make

    def __call__(self, hid: int):  # (the finish protocol: a handle already waited for)
        return self.make(*core_result(hid))


_c_wait_result = lib.commlib_wait_result


def _take_result(handle: Handle, hid: int, make):
    info = ffi.new("int64_t[3]")
    rc = _c_wait_result(hid, WAIT_SLICE_S, 1, info)
    while rc == _TIMEOUT:
        rc = _c_wait_result(hid, WAIT_SLICE_S, 1, info)
    handle._done = True
    _keepalive.pop(hid, None)
    if rc != _OK:
        handle._error = error_for(rc, last_error())
        raise handle._error
    return make(owned_bytes(info[0], info[1]), info[2])


def take_for(hid: int, make, keep):
    """``_take_result`` for a blocking call, without a Handle: waits for the
    handle id ``hid`` and returns ``make(data, rows)`` of its result (or
    raises its error); ``keep`` (its buffers) stays alive past a wait that
    Ctrl-C interrupts, as wait_for's."""
    info = ffi.new("int64_t[3]")
    rc = _c_wait_result(hid, WAIT_SLICE_S, 1, info)
    if rc == _TIMEOUT:
        _keepalive[hid] = keep
        while rc == _TIMEOUT:
            rc = _c_wait_result(hid, WAIT_SLICE_S, 1, info)
        del _keepalive[hid]
    if rc != _OK:
        raise error_for(rc, last_error())
    return make(owned_bytes(info[0], info[1]), info[2])


def owned_bytes(address: int, nbytes: int):
    """The result bytes at ``address`` (from the core's result pool) as a
    writable buffer that frees them when the last view of them goes away."""
    if not address:
        return bytearray()
    owned = ffi.gc(ffi.cast("char *", address), lib.commlib_free_result, size=nbytes)
    return ffi.buffer(owned, nbytes)


def wait_for(hid: int, keep):
    """``synchronize`` of a host request its caller waits for at once (a
    blocking call), without a Handle: waits for the handle id ``hid``, raises
    its error or returns ``keep`` (its buffers, alive meanwhile; kept past a
    wait that Ctrl-C interrupts, as a dropped Handle's are)."""
    rc = _c_wait_status(hid, WAIT_SLICE_S, True)
    if rc == _TIMEOUT:
        _keepalive[hid] = keep
        while rc == _TIMEOUT:
            rc = _c_wait_status(hid, WAIT_SLICE_S, True)
        del _keepalive[hid]
    if rc != _OK:
        raise error_for(rc, last_error())
    return keep


def synchronize_on_stream(handle: Handle, stream: int):
    """``synchronize`` for a collective on CUDA buffers that leaves the
    device work to the device: once the collective is launched (negotiated,
    and queued on the core's NCCL stream), the caller's ``stream`` (a
    ``cudaStream_t`` as an int; 0: the legacy default stream) is made to wait
    for its completion, and its result is returned at once; work queued on
    that stream afterwards sees the result. The host waits only for the
    launch. A failure after that (the GPU-side timeout, an NCCL error) is
    raised by the next ``synchronize`` of any handle. Other handles (CPU
    ones, or a collective that ended before its launch was seen) are
    synchronized as by ``synchronize``."""
    if not isinstance(handle, Handle):
        raise TypeError(f"expected a commlib Handle, got {type(handle).__name__}")
    if handle._done or handle._finish is not None:
        return synchronize(handle)  # (raises a failed handle's error again)
    hid, on_stream = handle._id, ffi.new("int*")
    cstream = ffi.cast("void*", stream)
    rc = lib.commlib_wait_on_stream(hid, cstream, WAIT_SLICE_S, on_stream)
    while rc == _TIMEOUT:
        rc = lib.commlib_wait_on_stream(hid, cstream, WAIT_SLICE_S, on_stream)
    handle._done = True
    keep = _keepalive.pop(hid, None)
    _drop_completed_detached()
    if on_stream[0]:
        _detached[hid] = keep  # (the device may still read and write its buffers)
    if rc != _OK:
        handle._error = error_for(rc, last_error())
        raise handle._error
    return handle._result


# Buffers of handles synchronized on a stream, by handle id, until the core
# has completed (and released) them; in the order they were synchronized.
_detached: dict[int, Any] = {}
_FULL_SCAN_MIN = 64
_full_scan_at = [_FULL_SCAN_MIN]


def _drop_completed_detached() -> None:
    """Forgets the buffers of detached handles whose collectives completed:
    the oldest ones, up to the first still running (a training step
    synchronizes its gradients in launch order, which the device completes
    them in: polling every one each time cost a step O(gradients^2) polls),
    and all of them whenever their number has doubled (collectives that
    complete out of order: other process sets, other streams)."""
    done = []
    for hid in _detached:
        if not lib.commlib_poll(hid):
            break
        done.append(hid)
    for hid in done:
        del _detached[hid]
    if len(_detached) >= _full_scan_at[0]:
        for hid in [h for h in _detached if lib.commlib_poll(h)]:
            del _detached[hid]
        _full_scan_at[0] = max(_FULL_SCAN_MIN, 2 * len(_detached))


def core_result(hid: int) -> tuple[memoryview, int]:
    """The result bytes of an allgather/alltoall (now owned by Python: freed
    when the last array viewing them goes away) and its rows."""
    info = ffi.new("int64_t[3]")
    rc = _c_wait_result(hid, 0.0, 0, info)  # (a completed handle: no wait)
    if rc != _OK:
        raise error_for(rc, last_error())
    return owned_bytes(info[0], info[1]), info[2]


def core_splits(hid: int, n: int) -> list[int]:
    out = ffi.new("int64_t[]", n)
    rc = lib.commlib_handle_splits(hid, out)
    if rc != lib.COMMLIB_OK:
        raise error_for(rc)
    return list(out)

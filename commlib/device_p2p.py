"""Point-to-point on device (CUDA) buffers, framework-free: buffers are raw
device pointers, streams are CUDA stream handles (0: the legacy default
stream). The data moves through NCCL, device to device; matching (source,
tag, process set) and the order of messages are those of ``commlib.send`` /
``commlib.recv``, and both ends progress in the background like theirs.

    h = device_p2p.isend_device(ptr, dtype_code, shape, dst, tag, device=0, stream=s)

    got = synchronize(device_p2p.irecv_device(src, tag, device=0, stream=s))
    if isinstance(got, device_p2p.DeviceMessage):   # it came from device memory
        device_p2p.release(got, dst_ptr, stream=s)   # copy it out (on s), free the core's memory
    else:                                           # a host message: the numpy array
        ...

A receive names the device (and stream) that device messages land on: in
``device_out`` when the caller has device memory of the message's size,
else in device memory the core allocates (stream-ordered), which the caller
copies out and frees with :func:`release`. A host message into such a
receive arrives as a numpy array (or in ``host_out``). A plain
``commlib.recv`` refuses a device message: both it and the send raise
ValueError saying why.

Each direction between two ranks is its own NCCL communicator of two ranks
(made on first use, its unique id carried by the point-to-point control
messages), so two ranks may send to each other at once. A transfer that
makes no progress for ``COMMLIB_TIMEOUT`` seconds fails on the rank where it
stalls (CollectiveTimeoutError), and its communicator is aborted. Frontends:
commlib.torch's send/recv on CUDA tensors (frontends/torch/cuda_p2p.py).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

from . import device_ops, runtime
from ._lib import check, ffi, lib
from .dtypes import dtype_code, dtype_size
from .handle import Handle
from .p2p import check_out, check_peer, check_tag, new_array
from .process_sets import process_set_id as _psid
from .submit import address, request, submit

__all__ = ["DeviceMessage", "isend_device", "irecv_device", "release"]


class DeviceMessage(NamedTuple):
    """A message received into device memory the core allocated: copy it out
    and free it with :func:`release`. ``dtype`` is the core's dtype code."""
    ptr: int
    dtype: int
    shape: tuple
    device: int

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * dtype_size(self.dtype)


def _submit_device(op_type: int, *, dtype: int, shape: Sequence[int] | None, ptr: int, peer: int, tag: int,
             psid: int, device: int, stream: int, on_device: bool, flags: int = 0) -> int:
    buf = "input" if op_type == lib.COMMLIB_OP_SEND else "output"
    return submit(request(op_type, None, shape=tuple(shape) if shape is not None else None,
                          process_set=psid, peer=peer, tag=tag, dtype=dtype, **{buf: address(ptr)},
                          device_type=lib.COMMLIB_DEVICE_CUDA if on_device else lib.COMMLIB_DEVICE_CPU,
                          device_id=device, stream=address(stream), p2p_flags=flags))


def isend_device(ptr: int, dtype: int, shape: Sequence[int], dst: int, tag: int = 0, process_set=None, *,
                 device: int, stream: int = 0, keepalive=None) -> Handle:
    """Starts sending the device buffer at ``ptr`` (``dtype`` code, ``shape``)
    to job rank ``dst`` once ``stream`` has reached this point;
    ``synchronize`` returns None once the data has reached the receiver.
    ``keepalive`` (the framework tensor) stays referenced until then."""
    runtime.require_init()
    device_ops.ensure_loaded()
    peer = check_peer(dst, "dst", process_set)
    hid = _submit_device(lib.COMMLIB_OP_SEND, dtype=dtype, shape=tuple(shape), ptr=ptr, peer=peer, tag=check_tag(tag),
                   psid=_psid(process_set), device=device, stream=stream, on_device=True)
    return Handle(hid, None, keepalive, "send")


def irecv_device(src: int, tag: int = 0, process_set=None, *, device: int, stream: int = 0, device_out: int = 0,
                 host_out=None, dtype: int = -1, shape: Sequence[int] | None = None, keepalive=None) -> Handle:
    """Starts receiving the next message from job rank ``src`` with ``tag``,
    taking device messages onto ``device`` (once ``stream`` has reached this
    point). ``synchronize`` returns None when the message landed in
    ``device_out`` (device memory of ``dtype`` and ``shape``), a
    :class:`DeviceMessage` when it landed in device memory the core allocated,
    or the numpy array of a host message (``host_out``, a numpy array, when
    given) or of a device message of no bytes. ``dtype``/``shape`` (or
    host_out's): what the message must be, else both ends raise ValueError."""
    runtime.require_init()
    device_ops.ensure_loaded()
    peer = check_peer(src, "src", process_set)
    if host_out is not None:
        if device_out:
            raise ValueError("irecv_device: pass device_out or host_out, not both")
        check_out(host_out)
        dtype, shape = dtype_code(host_out.dtype), host_out.shape
    elif device_out and (dtype < 0 or shape is None):
        raise ValueError("irecv_device: device_out needs its dtype and shape")
    if dtype < 0:
        shape = None
    ptr = host_out.ctypes.data if host_out is not None and host_out.size else device_out
    hid = _submit_device(lib.COMMLIB_OP_RECV, dtype=dtype, shape=shape, ptr=ptr, peer=peer, tag=check_tag(tag),
                   psid=_psid(process_set), device=device, stream=stream, on_device=bool(device_out),
                   flags=lib.COMMLIB_P2P_TAKES_DEVICE)

    def finish(h: int):
        where = ffi.new("void**")
        rc = lib.commlib_handle_p2p_result(h, where)
        if rc < 0:
            check(-rc)
        if rc == 2:
            code, ndim, dims = ffi.new("int*"), ffi.new("int*"), ffi.new("int64_t[]", 64)
            check(lib.commlib_handle_recv_info(h, code, ndim, dims, 64))
            return DeviceMessage(int(ffi.cast("uintptr_t", where[0])), code[0],
                                 tuple(dims[i] for i in range(ndim[0])), device)
        if host_out is not None:
            return host_out
        if device_out and rc == 0:
            return None  # (in device_out)
        return new_array(h)
    return Handle(hid, finish, (host_out, keepalive), "recv")


def release(message: DeviceMessage, dst: int = 0, *, stream: int = 0) -> None:
    """Queues on ``stream`` a copy of ``message`` into the device memory at
    ``dst`` (0: no copy), then frees the core's memory. Work queued on
    ``stream`` afterwards sees the copy."""
    if not isinstance(message, DeviceMessage):
        raise TypeError(f"release needs a DeviceMessage, got {type(message).__name__}")
    check(lib.commlib_device_release(ffi.cast("void*", message.ptr), ffi.cast("void*", dst), message.nbytes,
                                     message.device, ffi.cast("void*", stream)))

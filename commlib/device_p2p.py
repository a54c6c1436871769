"""Point-to-point on device (CUDA) buffers, framework-free: buffers are raw
device pointers, streams are CUDA stream handles (0: the legacy default
stream). The data moves through NCCL, device to device; matching (source,
tag, process set) and the order of messages are those of ``commlib.send`` /
``commlib.recv``.

A receiver does not know in advance whether a message is in host or device
memory, so it receives in two steps:

    h = device_p2p.irecv_or_claim(src, tag)        # posted like irecv
    got = synchronize(h)
    if isinstance(got, device_p2p.Claimed):       # a device message
        out = <device memory of got.dtype / got.shape>
        synchronize(device_p2p.irecv_claimed(got, out_ptr, device, stream))
    else:                                          # a host message: got is the array
        ...

The first step matches the message like any receive; a device message then
waits on its sender's side until the second step asks for its data (the
send completes when the data has arrived). A plain ``commlib.recv`` refuses
a device message: both it and the send raise ValueError saying why.

Each direction between two ranks is its own NCCL communicator of two ranks
(made on first use, its unique id carried by the point-to-point control
messages), so two ranks may send to each other at once. A transfer that
makes no progress for ``COMMLIB_TIMEOUT`` seconds fails on the rank where it
stalls (CollectiveTimeoutError), and its communicator is aborted. Frontends:
commlib.torch's send/recv on CUDA tensors (frontends/torch/p2p.py).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from . import device_ops, runtime
from ._lib import check, ffi, lib
from .handle import Handle
from .dtypes import dtype_code
from .p2p import check_out, check_peer, check_tag, new_array
from .process_sets import process_set_id as _psid

__all__ = ["Claimed", "isend_device", "irecv_or_claim", "irecv_claimed"]


class Claimed(NamedTuple):
    """A device message that ``irecv_or_claim`` took: receive its data with
    ``irecv_claimed``. ``dtype`` is the core's dtype code (commlib.dtypes)."""
    claim: int
    src: int
    tag: int
    process_set: Any
    dtype: int
    shape: tuple


def _enqueue(op_type: int, *, dtype: int, shape: Sequence[int] | None, ptr: int, peer: int, tag: int,
             psid: int, device: int | None = None, stream: int = 0, flags: int = 0, claim: int = 0) -> int:
    req = ffi.new("commlib_request*")
    dims = ffi.new("int64_t[]", list(shape) or [0]) if shape is not None else ffi.NULL
    req.op_type, req.process_set, req.peer, req.tag = op_type, psid, peer, tag
    req.dtype = dtype
    req.ndim = len(shape) if shape is not None else 0
    req.shape = dims
    buf = ffi.cast("void*", ptr)
    if op_type == lib.COMMLIB_OP_SEND:
        req.input = buf
    else:
        req.output = buf
    if device is not None:
        req.device_type, req.device_id, req.stream = lib.COMMLIB_DEVICE_CUDA, device, ffi.cast("void*", stream)
    req.p2p_flags, req.p2p_claim = flags, claim
    hid = ffi.new("int64_t*")
    check(lib.commlib_enqueue(req, hid))
    return hid[0]


def isend_device(ptr: int, dtype: int, shape: Sequence[int], dst: int, tag: int = 0, process_set=None, *,
                 device: int, stream: int = 0, keepalive=None) -> Handle:
    """Starts sending the device buffer at ``ptr`` (``dtype`` code, ``shape``)
    to job rank ``dst`` once ``stream`` has reached this point;
    ``synchronize`` returns None once the data has reached the receiver.
    ``keepalive`` (the framework tensor) stays referenced until then."""
    runtime.require_init()
    device_ops.ensure_loaded()
    peer = check_peer(dst, "dst", process_set)
    hid = _enqueue(lib.COMMLIB_OP_SEND, dtype=dtype, shape=tuple(shape), ptr=ptr, peer=peer, tag=check_tag(tag),
                   psid=_psid(process_set), device=device, stream=stream)
    return Handle(hid, None, keepalive, "send")


def irecv_or_claim(src: int, tag: int = 0, out=None, process_set=None, dtype: int = -1,
                   shape: Sequence[int] | None = None) -> Handle:
    """``commlib.irecv`` that also takes a device message: ``synchronize``
    returns the array (``out``, or a new one) for a host message, or a
    :class:`Claimed` for a device message. ``dtype``/``shape`` (without
    ``out``): what the message must be (else both ends raise ValueError); a
    host message then lands in a new array."""
    runtime.require_init()
    peer = check_peer(src, "src", process_set)
    tag = check_tag(tag)
    psid = _psid(process_set)
    if out is not None:
        check_out(out)
        dtype, shape, ptr = dtype_code(out.dtype), out.shape, out.ctypes.data if out.size else 0
    else:
        ptr = 0
        if dtype < 0:
            shape = None
    hid = _enqueue(lib.COMMLIB_OP_RECV, dtype=dtype, shape=shape, ptr=ptr, peer=peer, tag=tag, psid=psid,
                   flags=lib.COMMLIB_P2P_MAY_CLAIM)

    def finish(h: int):
        claim = lib.commlib_handle_claim(h)
        if claim < 0:
            check(-claim)
        if claim > 0:
            code, ndim, dims = ffi.new("int*"), ffi.new("int*"), ffi.new("int64_t[]", 64)
            check(lib.commlib_handle_recv_info(h, code, ndim, dims, 64))
            return Claimed(claim, peer, tag, process_set, code[0], tuple(dims[i] for i in range(ndim[0])))
        return out if out is not None else new_array(h)
    return Handle(hid, finish, out, "recv")


def irecv_claimed(claimed: Claimed, ptr: int, *, device: int, stream: int = 0, keepalive=None) -> Handle:
    """Starts receiving a claimed device message into the device buffer at
    ``ptr`` (of the message's dtype and shape), once ``stream`` has reached
    this point; ``synchronize`` returns None once the data is there."""
    if not isinstance(claimed, Claimed):
        raise TypeError(f"irecv_claimed needs a Claimed, got {type(claimed).__name__}")
    hid = _enqueue(lib.COMMLIB_OP_RECV, dtype=claimed.dtype, shape=claimed.shape, ptr=ptr, peer=claimed.src,
                   tag=claimed.tag, psid=_psid(claimed.process_set), device=device, stream=stream,
                   claim=claimed.claim)
    return Handle(hid, None, keepalive, "recv")

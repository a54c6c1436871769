"""Point-to-point messages between two ranks: send, recv, sendrecv.

    if commlib.rank() == 0:
        commlib.send(np.arange(4.0), dst=1, tag=7)
    elif commlib.rank() == 1:
        x = commlib.recv(src=0, tag=7)          # dtype and shape come with the message

A send and its receive meet directly (matched by source, tag and process
set), never through rank 0. Between one pair of ranks, messages with one tag
arrive in the order they were sent; messages with different tags may be
received in any order. ``dst``/``src`` are job ranks (as broadcast's root is).

A send completes once its receiver has taken the data (as MPI_Ssend does), so
two ranks exchanging data post ``isend`` first, or call ``sendrecv``. A
receive with ``out`` must get a message of out's dtype and element count:
otherwise both the receive and the send raise ValueError, naming both shapes.
A peer outside the job or the set raises ValueError before anything is sent; a
peer that dies raises RankLostError; a send or receive with no match warns
after COMMLIB_STALL_CHECK_TIME and raises CollectiveTimeoutError after
COMMLIB_TIMEOUT (a send that timed out is withdrawn: no later receive gets
it). Point-to-point runs concurrently with collectives and goes on
between the other ranks after rank 0 has called shutdown().

Transport: between ranks of one host the control messages go through
shared-memory rings; messages up to 4 KiB (one host) or
COMMLIB_P2P_EAGER_BYTES (other hosts) travel inside their header, larger ones
on one host are copied once from the sender's memory (process_vm_readv), from
COMMLIB_P2P_SPLIT_BYTES on by both ranks at once when the sender waits in
commlib; across hosts (or with COMMLIB_P2P_SINGLE_COPY=0) they go through MPI.
A CUDA message (commlib.torch) goes through NCCL; ``recv`` here refuses one.
"""
from __future__ import annotations

import numpy as np

from . import runtime
from ._lib import check, ffi, lib
from .checks import integer
from .dtypes import dtype_code, numpy_dtype
from .handle import WAIT_SLICE_S, Handle, core_result, synchronize
from .ops import as_input
from .submit import cached_facts, describe, p2p_blocking, request, submit
from .process_sets import members as _members
from .process_sets import process_set_id as _psid

_MAX_DIMS = 64
_SEND, _RECV = lib.COMMLIB_OP_SEND, lib.COMMLIB_OP_RECV


def check_peer(peer, what: str, process_set) -> int:
    peer = integer(peer, what)
    n = runtime.size()
    if not 0 <= peer < n:
        raise ValueError(f"{what} {peer} is outside the job (ranks 0..{n - 1})")
    if process_set is not None and peer not in _members(process_set):
        raise ValueError(f"{what} {peer} is not a member of {process_set}")
    return peer


def check_tag(tag) -> int:
    tag = integer(tag, "tag")
    if not 0 <= tag < 2**63:
        raise ValueError(f"tag must be between 0 and 2**63-1, got {tag}")
    return tag


def _request(send: bool, f, peer: int, tag: int, psid: int):
    """The request of a send of (a receive into) the buffer ``f``
    (commlib.submit.Facts) describes, or of a receive into memory the core
    allocates (f None); a buffer's last one again when its arguments repeat."""
    if f is None:
        return request(_RECV, None, dtype=-1, peer=peer, tag=tag, process_set=psid)
    args = (send, peer, tag, psid)
    last = f.last
    if last is not None and last[0] == args:
        return last[1]
    r = request(_SEND if send else _RECV, None, dtype=f.code, ndim=f.ndim, shape=f.cshape, peer=peer,
                tag=tag, process_set=psid, **{"input" if send else "output": f.ptr})
    f.last = (args, r)
    return r


def _submit(op_type: int, arr, out, peer: int, tag: int, psid: int) -> int:
    buf = arr if arr is not None else out  # (checked by the caller: as_input, or check_out)
    return submit(_request(op_type == _SEND, None if buf is None else describe(buf), peer, tag, psid))


def _blocking(op_type: int, arr, out, peer: int, tag: int, psid: int) -> None:
    """Runs one request to completion in one core call; one still pending
    after a slice (long waits, so that Ctrl-C reaches Python) is synchronized."""
    buf = arr if arr is not None else out
    _finish(p2p_blocking(_request(op_type == _SEND, describe(buf), peer, tag, psid), WAIT_SLICE_S), arr, out)


def _finish(rc: int, arr, out) -> None:
    """Waits for a blocking call's request still pending (rc: its handle)."""
    if rc > 0:
        synchronize(Handle(rc, None, (arr, out), "send" if arr is not None else "recv"))


def _send_array(array) -> np.ndarray:
    arr = as_input(array)
    if arr.ndim > _MAX_DIMS:
        raise ValueError(f"send: at most {_MAX_DIMS} dimensions, got {arr.ndim}")
    return arr


def isend(array, dst, tag=0, process_set=None) -> Handle:
    """Starts sending ``array`` to job rank ``dst``; ``synchronize`` returns
    None once the receiver has taken it. Keep the array unchanged until then."""
    runtime.require_init()
    arr = _send_array(array)
    peer = check_peer(dst, "dst", process_set)
    hid = _submit(lib.COMMLIB_OP_SEND, arr, None, peer, check_tag(tag), _psid(process_set))
    return Handle(hid, None, arr, "send")


_TAGS = 2**63  # tags are int64 in the core


def plain_peer_and_tag(peer, tag) -> bool:
    """Whether a fast path may take ``peer`` and ``tag`` as they are: ints,
    the tag within the core's int64 (the core checks the rest)."""
    return type(peer) is int and type(tag) is int and 0 <= tag < _TAGS


def blocking_at(send: bool, f, peer: int, tag: int, keep) -> None:
    """A blocking send of, or receive into, the memory ``f`` describes
    (commlib.submit.Facts) on the global set, in one core call; the core
    checks the peer and the tag. ``keep`` stays alive while a long wait goes
    on. For frontends' fast paths."""
    rc = p2p_blocking(_request(send, f, peer, tag, 0), WAIT_SLICE_S)
    if rc:
        _finish(rc, keep if send else None, None if send else keep)




def send(array, dst, tag=0, process_set=None) -> None:
    """Sends ``array`` to job rank ``dst``; returns once the receiver took it."""
    # The common call (a numpy array whose facts are cached, int peer and tag,
    # the global set) goes straight into the core, which checks the peer and
    # initialisation itself, with the messages the long way gives; a round
    # trip pays this path twice, so it makes as few Python calls as it can.
    if process_set is None and type(array) is np.ndarray and type(dst) is int and type(tag) is int \
            and 0 <= tag < _TAGS:
        f = cached_facts(array, False)
        if f is not None:
            blocking_at(True, f, dst, tag, array)
            return
    runtime.require_init()
    arr = _send_array(array)
    _blocking(lib.COMMLIB_OP_SEND, arr, None, check_peer(dst, "dst", process_set), check_tag(tag),
              _psid(process_set))


def irecv(src, tag=0, out=None, process_set=None) -> Handle:
    """Starts receiving the next message from job rank ``src`` with ``tag``;
    ``synchronize`` returns the array: ``out`` (filled in) when given, else a
    new array of the message's dtype and shape."""
    runtime.require_init()
    if out is not None:
        check_out(out)
    peer = check_peer(src, "src", process_set)
    hid = _submit(lib.COMMLIB_OP_RECV, None, out, peer, check_tag(tag), _psid(process_set))
    if out is not None:
        return Handle(hid, None, out, "recv", out)
    return Handle(hid, new_array, None, "recv")


def check_out(out) -> None:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"recv needs a numpy.ndarray as out, got {type(out).__name__}")
    dtype_code(out.dtype)
    if not out.flags.c_contiguous:
        raise ValueError("recv needs a C-contiguous out array; use numpy.ascontiguousarray() first")
    if not out.flags.writeable:
        raise ValueError("recv cannot write into a read-only out array")


def new_array(hid: int) -> np.ndarray:
    dtype = ffi.new("int*")
    ndim = ffi.new("int*")
    shape = ffi.new("int64_t[]", _MAX_DIMS)
    check(lib.commlib_handle_recv_info(hid, dtype, ndim, shape, _MAX_DIMS))
    dims = tuple(shape[i] for i in range(ndim[0]))
    data, _rows = core_result(hid)
    return np.frombuffer(data, dtype=numpy_dtype(dtype[0])).reshape(dims)


def recv(src, tag=0, out=None, process_set=None) -> np.ndarray:
    """Receives the next message from job rank ``src`` with ``tag``."""
    if out is None:
        return synchronize(irecv(src, tag, out, process_set))
    if process_set is None and type(src) is int and type(tag) is int and 0 <= tag < _TAGS:
        f = cached_facts(out, True)  # (send's fast path, for a receive into out)
        if f is not None:
            blocking_at(False, f, src, tag, out)
            return out
    runtime.require_init()
    check_out(out)
    _blocking(lib.COMMLIB_OP_RECV, None, out, check_peer(src, "src", process_set), check_tag(tag),
              _psid(process_set))
    return out


def sendrecv(array, dst, src, send_tag=0, recv_tag=0, out=None, process_set=None) -> np.ndarray:
    """Sends ``array`` to ``dst`` and receives from ``src`` at once (both
    posted before either waits, so a ring of exchanges cannot deadlock);
    returns the received array."""
    runtime.require_init()
    array = _send_array(array)  # (checked before the receive is posted)
    check_peer(dst, "dst", process_set)
    check_tag(send_tag)
    r = irecv(src, recv_tag, out, process_set)
    s = isend(array, dst, send_tag, process_set)
    result = synchronize(r)
    synchronize(s)
    return result

"""The one way a request enters the core. ``request(...)`` fills a C
``commlib_request`` (the only place in Python that does), ``submit(r)``
hands it to the core's one entry, ``commlib_submit``, and returns the
handle id (the core's error raised). Every collective, group, send and
receive of the numpy API, the device paths and the frontends goes through
these two.

A training loop submits the same buffers step after step, and building a
request again (the name as a C string, the shape as a C array, the data
address) costs more than the core's own bookkeeping of it; so:
``describe(arr)`` caches the facts of a numpy array by its identity (checked
on each use against what can change on a live array: shape, dtype,
contiguity, writability), frontends cache their tensors' facts the same way
(``Facts``), and ``submit_in_place`` keeps the last request built for each
buffer, submitted again as it is while its arguments repeat."""
from __future__ import annotations

import threading
import weakref

import numpy as np

from . import runtime
from ._lib import check, ffi, lib
from .checks import scale_factors
from .dtypes import dtype_code

NULL = ffi.NULL
_VOIDP = ffi.typeof("void *")
_REQUEST = ffi.typeof("commlib_request *")
_c_submit = lib.commlib_submit


def _bounded(cache: dict, limit: int) -> dict:
    if len(cache) >= limit:
        cache.clear()
    return cache


# Shapes as C arrays, by shape tuple: a training step submits the same shapes
# again and again, and a fresh cffi array costs more than the lookup.
_shape_arrays: dict = {}


def shape_array(shape: tuple):
    arr = _shape_arrays.get(shape)
    if arr is None:
        arr = _bounded(_shape_arrays, 4096)[shape] = ffi.new("int64_t[]", list(shape) or [0])
    return arr


def address(addr: int):
    """A data address as the core's pointer (NULL for 0: nothing to move)."""
    return ffi.cast(_VOIDP, addr) if addr else NULL


# Given names as the core's C strings, by name: a training loop submits the
# same names step after step, and checking and encoding them each time costs
# more than this lookup.
_names: dict = {}


def c_name(kind: str, name=None, psid: int = 0):
    """``runtime.auto_name(kind, name, psid)`` as a C string (a given name
    checked once, then looked up; a generated one made afresh)."""
    if type(name) is str:
        c = _names.get(name)
        if c is None:
            c = _bounded(_names, 8192)[name] = ffi.new("char[]", runtime.auto_name(kind, name, psid).encode())
        return c
    return ffi.new("char[]", runtime.auto_name(kind, name, psid).encode())


class Request:
    """A filled ``commlib_request`` (``c``) and the C arrays it points to."""

    __slots__ = ("c", "keep")

    def __init__(self, c, keep):
        self.c = c
        self.keep = keep


def request(op_type: int, name=None, *, shape=None, splits=None, output_rows: int = -1,
            prescale: float = 1.0, postscale: float = 1.0, **fields) -> Request:
    """The request of one submission: ``name`` a C string (c_name) or a
    str, ``shape`` a tuple (or a C array from shape_array; ndim given then),
    ``splits`` a list of ints; every other field of commlib_request by its
    name, with the C value it takes (pointers as cdata: ``address``)."""
    req = ffi.new(_REQUEST)
    keep = []
    req.op_type = op_type
    if name is not None:
        if type(name) is str:
            name = ffi.new("char[]", name.encode())
        keep.append(name)  # (a C string made for this call lives as long as the request)
        req.name = name
    if type(shape) is tuple:
        req.ndim = len(shape)
        req.shape = shape_array(shape)
    elif shape is not None:
        req.shape = shape
    if splits is not None:
        s = ffi.new("int64_t[]", list(splits) or [0])
        keep.append(s)
        req.splits, req.nsplits = s, len(splits)
    req.output_rows = output_rows
    req.prescale, req.postscale = scale_factors(prescale, postscale)
    for field, value in fields.items():
        setattr(req, field, value)
    return Request(req, keep)


def submit(r: Request) -> int:
    """Submits a request; returns its handle id (the core's error raised).
    (Before init() the core refuses it with NotInitializedError.)"""
    hid = _c_submit(r.c)
    if hid < 0:
        check(-hid)
    return hid


def p2p_blocking(r: Request, timeout_s: float) -> int:
    """A send or receive run to completion by this thread (commlib_p2p_blocking):
    0 when done, else the handle id of the still pending request."""
    rc = lib.commlib_p2p_blocking(r.c, timeout_s)
    if rc < 0:
        check(-rc)
    return rc


class Facts:
    """What the core needs to know about one buffer written in place (the
    dtype's code, ndim, the shape as a C array, the data pointer), and the
    last request submitted on it (``last``: its arguments and the Request),
    and the last in-place allreduce on it through a collective's quickest
    path (``quick``: that call's arguments as given, the C request and its
    Request; see ``submit_again``)."""

    __slots__ = ("ref", "shape", "dtype", "code", "ndim", "cshape", "ptr", "last", "quick")

    def __init__(self, code: int, shape: tuple, ptr, ref=None, dtype=None):
        self.ref, self.shape, self.dtype, self.code = ref, shape, dtype, code
        self.ndim, self.cshape, self.ptr = len(shape), shape_array(shape), ptr
        self.last = None
        self.quick = None


def submit_in_place(f: Facts, op_type: int, kind: str, name, reduce_op: int, prescale: float,
                    postscale: float, psid: int, out=None) -> int:
    """Submits a request on the buffer ``f`` describes, written in place, or
    into ``out`` when given (an ``address``: a buffer of f's dtype and shape
    apart from f's), named ``runtime.auto_name(kind, name, psid)``. With a
    given name and the arguments of the last call on ``f``, its request is
    submitted again as it is (with ``out`` as its output; the core copies
    what it keeps)."""
    args = (op_type, name, reduce_op, prescale, postscale, psid, out is None)
    last = f.last
    if last is not None and last[0] == args:
        return submit(last[1]) if out is None else again_at(last, out)
    r = request(op_type, c_name(kind, name, psid), dtype=f.code, ndim=f.ndim, shape=f.cshape,
                input=f.ptr, output=f.ptr if out is None else out, reduce_op=reduce_op,
                prescale=prescale, postscale=postscale, process_set=psid)
    if type(name) is str:  # (a generated name differs on every call)
        f.last = (args, r)
    return submit(r)


def repeat(f: Facts | None, key: tuple):
    """The last request submitted on f's buffer, as ``(key, Request,
    extra)``, when ``key`` (an operation, a given name and every other
    argument that shapes it) is that call's; else None (also for no f: an
    array whose facts are not cached). A collective that
    finds it submits the Request again (the core copies what it keeps), with
    a new output pointer where the output is new (``again``), and skips
    checking and building what an identical call already had."""
    last = None if f is None else f.last
    if last is not None and len(last) == 3 and last[0] == key:
        return last
    return None


def again(last, out=None) -> int:
    """Submits ``repeat``'s Request again, writing into ``out`` (a numpy
    array) when given (under a lock: another thread's identical call must
    not submit this one's output; the core copies what it keeps)."""
    r = last[1]
    if out is None:
        return submit(r)
    with _again_lock:
        r.c.output = ffi.from_buffer(out, require_writable=True)
        return submit(r)


def again_at(last, out) -> int:
    """``again`` writing into the buffer at ``out`` (an ``address``)."""
    with _again_lock:
        last[1].c.output = out
        return submit(last[1])


def again_in_place(r: Request, ptr) -> int:
    """Submits r again reading and writing the buffer at ``ptr`` (an ``address``)."""
    with _again_lock:
        r.c.input = r.c.output = ptr
        return submit(r)


_again_lock = threading.Lock()

# Requests of named calls on buffers that are not described (a new tensor
# each call, as a training loop's metric), by their arguments but the buffers.
_fresh: dict = {}


def submit_fresh(op_type: int, kind: str, name: str, code: int, shape: tuple, inp, out, reduce_op: int,
                 prescale: float, postscale: float) -> int:
    """Submits a request on the global set reading ``inp`` and writing
    ``out`` (``address``es of a buffer of dtype ``code`` and ``shape``, and of
    one like it), named ``name``, without describing the buffer: a call that
    repeats an earlier one's arguments but its buffers submits that call's
    request again with the new addresses (the core copies what it keeps)."""
    key = (op_type, name, code, shape, reduce_op, prescale, postscale)
    r = _fresh.get(key)
    if r is None:
        r = request(op_type, c_name(kind, name, 0), dtype=code, ndim=len(shape), shape=shape_array(shape),
                    input=inp, output=out, reduce_op=reduce_op, prescale=prescale, postscale=postscale)
        _bounded(_fresh, 1024)[key] = r
        return submit(r)
    with _again_lock:
        r.c.input, r.c.output = inp, out
        return submit(r)


def submit_remembered(f: Facts, key: tuple, r: Request, extra=None) -> int:
    """Submits r, remembered on f under key (for ``repeat``)."""
    f.last = (key, r, extra)
    return submit(r)


def array_fields(inp: np.ndarray | None, out: np.ndarray | None) -> dict:
    """request()'s fields of a numpy input (sent; None: none) and output
    (written; None or empty: none)."""
    fields = {}
    in_ptr = NULL
    if inp is not None:
        f = describe(inp)
        in_ptr = f.ptr
        fields.update(dtype=f.code, ndim=f.ndim, shape=f.cshape, input=in_ptr)
    if out is not None and out.size:
        # (in place: one pointer; the caller checked it writable)
        fields["output"] = in_ptr if out is inp else ffi.from_buffer(out, require_writable=True)
    return fields


_facts: dict[int, Facts] = {}
_FACTS_LIMIT = 8192


def _held(f: Facts | None, arr) -> bool:
    """Whether ``f`` (the cache entry at ``id(arr)``) still describes ``arr``."""
    return f is not None and f.ref() is arr and arr.dtype is f.dtype and arr.shape == f.shape


def describe(arr: np.ndarray) -> Facts:
    """The facts of a C-contiguous array of a supported dtype (the caller
    checked it: as_input / a writable-output check), cached."""
    key = id(arr)
    f = _facts.get(key)
    if _held(f, arr):
        return f
    # (an address, not from_buffer's object: that would keep arr alive here)
    ptr = address(int(ffi.cast("uintptr_t", ffi.from_buffer(arr)))) if arr.size else NULL
    f = _bounded(_facts, _FACTS_LIMIT)[key] = Facts(
        dtype_code(arr.dtype), arr.shape, ptr, weakref.ref(arr, lambda _r: _facts.pop(key, None)), arr.dtype)
    return f


def submit_again(f: Facts, given: tuple) -> int:
    """Submits again the request recorded on ``f`` by ``remember_quick`` when
    ``given`` are exactly that call's arguments, and returns its handle id;
    0 when they are not (nothing submitted). The caller checked that ``f``
    still describes its buffer. The cheapest way back into the core: a
    training loop's in-place allreduces repeat word for word step after
    step."""
    quick = f.quick
    if quick is None or quick[0] != given:
        return 0
    hid = _c_submit(quick[1])
    if hid < 0:
        check(-hid)
    return hid


def quick_repeat(arr, given: tuple) -> int:
    """``submit_again`` on the facts of a numpy array, when they still
    describe it (the same array, dtype and shape, C-contiguous and
    writable); else 0."""
    f = _facts.get(id(arr))
    if f is None or f.quick is None or f.ref() is not arr or arr.dtype is not f.dtype or arr.shape != f.shape:
        return 0
    flags = arr.flags
    return submit_again(f, given) if flags.c_contiguous and flags.writeable else 0


def remember_quick(f: Facts, given: tuple) -> None:
    """Records the request just submitted in place on the buffer ``f``
    describes (its ``last``) as the one ``submit_again(f, given)``
    submits."""
    if f.last is not None:
        r = f.last[1]
        f.quick = (given, r.c, r)


def cached_facts(arr, writable: bool) -> Facts | None:
    """The cached facts of ``arr`` when they still hold and it is still
    C-contiguous (and writable, when written into); None otherwise (the
    caller then checks the array the long way, with its error messages)."""
    f = _facts.get(id(arr))
    if not _held(f, arr):
        return None
    flags = arr.flags
    if not flags.c_contiguous or (writable and not flags.writeable):
        return None
    return f


_KINDS = {"allreduce": lib.COMMLIB_OP_ALLREDUCE, "allgather": lib.COMMLIB_OP_ALLGATHER,
          "broadcast": lib.COMMLIB_OP_BROADCAST, "alltoall": lib.COMMLIB_OP_ALLTOALL,
          "reducescatter": lib.COMMLIB_OP_REDUCESCATTER}


def abort(kind: str, name: str, psid: int, why: str) -> None:
    """Tells the other members of process set ``psid`` that this rank refused
    its collective ``name``, a ``kind`` ("allreduce", "broadcast", ...; see
    commlib.refusals), through commlib_abort."""
    r = request(_KINDS[kind], name, process_set=psid)
    check(lib.commlib_abort(r.c, ffi.new("char[]", why.encode("utf-8", "replace"))))

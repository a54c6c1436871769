"""One request into the core from facts about its memory (the dtype's core
code, the shape as a C array, the data address): the submission path of the
numpy API's single-array collectives and of the frontends' single-tensor
calls, which describe a tensor without building a numpy view of it.

A training loop submits the same arrays step after step, and working their
facts out again (``ffi.from_buffer``, the dtype lookup) costs more than the
core's own bookkeeping of the request; so the facts of a numpy array are
cached by the array's identity and checked on each use against what can
change on a live array (its shape, dtype, contiguity and writability; numpy
does not let an array's data move)."""
from __future__ import annotations

import weakref

import numpy as np

from . import runtime
from ._lib import check, ffi, lib
from .dtypes import dtype_code

NULL = ffi.NULL
_VOIDP = ffi.typeof("void *")

# Shapes as C arrays, by shape tuple: a training step submits the same shapes
# again and again, and a fresh cffi array costs more than the lookup.
_shape_arrays: dict = {}


def shape_array(shape: tuple):
    arr = _shape_arrays.get(shape)
    if arr is None:
        if len(_shape_arrays) >= 4096:
            _shape_arrays.clear()
        arr = _shape_arrays[shape] = ffi.new("int64_t[]", list(shape) or [0])
    return arr


def address(addr: int):
    """A data address as the core's pointer (NULL for 0: nothing to move)."""
    return ffi.cast(_VOIDP, addr) if addr else NULL


_c_submit = lib.commlib_submit
_c_submit_tensor = lib.commlib_submit_tensor

# Given names as the core's C strings, by name: a training loop submits the
# same names step after step, and checking and encoding them each time costs
# more than this lookup.
_name_bytes: dict = {}


def name_bytes(kind: str, name, psid: int = 0) -> bytes:
    """``runtime.auto_name(kind, name, psid)`` encoded for the core (a given
    name checked once, then looked up; a generated one made afresh)."""
    if type(name) is str:
        b = _name_bytes.get(name)
        if b is not None:
            return b
    b = runtime.auto_name(kind, name, psid).encode()
    if type(name) is str:
        if len(_name_bytes) >= 8192:
            _name_bytes.clear()
        _name_bytes[name] = b
    return b


def submit(op_type: int, name: str, code: int, ndim: int, cshape, in_ptr, out_ptr,
           reduce_op: int = 0, prescale: float = 1.0, postscale: float = 1.0, root: int = 0,
           psid: int = 0) -> int:
    """Submits one request; returns its handle id (the core's error raised)."""
    hid = _c_submit(op_type, name.encode(), code, ndim, cshape, in_ptr, out_ptr, reduce_op,
                    prescale, postscale, root, psid)
    if hid < 0:
        check(-hid)
    return hid


def submit_named(op_type: int, kind: str, name, code: int, ndim: int, cshape, in_ptr, out_ptr,
                 reduce_op: int, prescale: float, postscale: float, root: int, psid: int) -> int:
    """submit() named ``runtime.auto_name(kind, name, psid)`` (see name_bytes):
    the path of a training loop's repeated calls, kept short."""
    b = _name_bytes.get(name) if type(name) is str else None
    if b is None:
        b = name_bytes(kind, name, psid)
    hid = _c_submit(op_type, b, code, ndim, cshape, in_ptr, out_ptr, reduce_op, prescale,
                    postscale, root, psid)
    if hid < 0:
        check(-hid)
    return hid


def submit_in_place(op_type: int, kind: str, name, f: "ArrayFacts", reduce_op: int,
                    prescale: float, postscale: float, psid: int) -> int:
    """submit_named() of an in-place request on the array ``f`` describes,
    through its C description (four arguments fewer for cffi to convert)."""
    b = _name_bytes.get(name) if type(name) is str else None
    if b is None:
        b = name_bytes(kind, name, psid)
    hid = _c_submit_tensor(op_type, b, f.ctensor or f.make_ctensor(), reduce_op, prescale,
                           postscale, psid)
    if hid < 0:
        check(-hid)
    return hid


class ArrayFacts:
    """What the core needs to know about one numpy array."""

    __slots__ = ("ref", "shape", "dtype", "code", "ndim", "cshape", "ptr", "ctensor")

    def __init__(self, arr: np.ndarray, key: int):
        self.ref = weakref.ref(arr, lambda _r: _facts.pop(key, None))
        self.shape = arr.shape
        self.dtype = arr.dtype
        self.code = dtype_code(arr.dtype)
        self.ndim = arr.ndim
        self.cshape = shape_array(arr.shape)
        # (an address, not from_buffer's object: that would keep arr alive here)
        self.ptr = address(int(ffi.cast("uintptr_t", ffi.from_buffer(arr)))) if arr.size else NULL
        self.ctensor = None  # all of it as one C struct: made by submit_in_place's first call

    def make_ctensor(self):
        """The facts as a commlib_tensor (pointing at cshape, held here)."""
        self.ctensor = ffi.new("commlib_tensor *", {"dtype": self.code, "ndim": self.ndim,
                                                    "shape": self.cshape, "data": self.ptr})
        return self.ctensor


_facts: dict[int, ArrayFacts] = {}
_FACTS_LIMIT = 8192


def _held(f: ArrayFacts | None, arr) -> bool:
    """Whether ``f`` (the cache entry at ``id(arr)``) still describes ``arr``."""
    return f is not None and f.ref() is arr and arr.dtype is f.dtype and arr.shape == f.shape


def facts(arr: np.ndarray) -> ArrayFacts:
    """The facts of a C-contiguous array of a supported dtype (the caller
    checked it: as_input / a writable-output check), cached."""
    key = id(arr)
    f = _facts.get(key)
    if _held(f, arr):
        return f
    if len(_facts) >= _FACTS_LIMIT:
        _facts.clear()
    f = _facts[key] = ArrayFacts(arr, key)
    return f


def cached_facts(arr, writable: bool) -> ArrayFacts | None:
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

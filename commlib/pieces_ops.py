"""Reduce-scatter of an array given in pieces, read in place.

    h = commlib.reducescatter_pieces_async([g1, g2, 7], shape=(2, 10), dtype=np.float32,
                                           out=shard)

reduces, across ranks, the array of ``shape`` whose elements (in C order) are
the pieces end to end (an int stands for that many zeros: padding), exactly as
``reducescatter(np.concatenate([...]).reshape(shape))`` would, but without
building that array: the core reads each piece where it lies. ZeRO uses it to
reduce-scatter a bucket of parameter gradients into the owner's shard with no
packing copy. Every rank must pass the same shape and dtype; how each rank
cuts its input into pieces is its own affair.
"""
from __future__ import annotations

import math

import numpy as np

from . import runtime
from ._lib import ffi, lib
from .dtypes import dtype_code
from .handle import Handle, synchronize
from .ops import Average, check_out_part, reducescatter_rows, resolve_op
from .process_sets import process_set_id
from .submit import request, submit


def _check_pieces(pieces, dtype: np.dtype) -> tuple[list, list]:
    """(pointers, element counts) of ``pieces``; TypeError/ValueError for bad ones."""
    if isinstance(pieces, (np.ndarray, str, bytes)) or not hasattr(pieces, "__iter__"):
        raise TypeError("reducescatter_pieces takes a list of arrays and ints (zeros)")
    ptrs, counts = [], []
    for i, p in enumerate(pieces):
        if isinstance(p, (int, np.integer)) and not isinstance(p, bool):
            if p < 0:
                raise ValueError(f"reducescatter_pieces: piece {i} is {p} zeros; give a count >= 0")
            ptrs.append(ffi.NULL)
            counts.append(int(p))
            continue
        if not isinstance(p, np.ndarray):
            raise TypeError(f"reducescatter_pieces: piece {i} is a {type(p).__name__}; give a "
                            "numpy array or an int (that many zeros)")
        if p.dtype != dtype:
            raise TypeError(f"reducescatter_pieces: piece {i} has dtype {p.dtype}, the array {dtype}")
        if not p.flags.c_contiguous:
            raise ValueError(f"reducescatter_pieces: piece {i} is not C-contiguous")
        ptrs.append(ffi.from_buffer(p, require_writable=False) if p.size else ffi.NULL)
        counts.append(int(p.size))
    return ptrs, counts


def reducescatter_pieces_async(pieces, shape, dtype, op=Average, name=None, prescale_factor=1.0,
                               postscale_factor=1.0, process_set=None, out=None) -> Handle:
    """Starts the reduce-scatter of the array of ``shape`` and ``dtype`` made
    of ``pieces`` (C-contiguous arrays of ``dtype`` and ints, counts of
    zeros, end to end, their sizes adding up to the shape's); this rank's part
    of dimension 0 (split as ``reducescatter`` splits it) is written into
    ``out`` (allocated when None), which is the result. The pieces must stay
    unchanged until the handle completes."""
    dtype = np.dtype(dtype)
    code = dtype_code(dtype)
    shape = tuple(int(s) for s in shape)
    if not shape or any(s < 0 for s in shape):
        raise ValueError(f"reducescatter_pieces needs a shape with at least one dimension, "
                         f"none negative; got {shape}")
    ptrs, counts = _check_pieces(pieces, dtype)
    total = math.prod(shape)
    if sum(counts) != total:
        raise ValueError(f"reducescatter_pieces: the pieces hold {sum(counts)} elements, the "
                         f"shape {shape} {total}")
    psid = process_set_id(process_set)
    part = (reducescatter_rows(shape[0], process_set),) + shape[1:]
    if out is None:
        out = np.empty(part, dtype=dtype)
    else:
        check_out_part(out, part, dtype, "reducescatter_pieces")
        if any(isinstance(p, np.ndarray) and np.may_share_memory(out, p) for p in pieces):
            raise ValueError("reducescatter_pieces: out must not overlap a piece")
    cptrs = ffi.new("void*[]", ptrs or [ffi.NULL])
    ccounts = ffi.new("int64_t[]", counts or [0])
    hid = submit(request(
        lib.COMMLIB_OP_REDUCESCATTER, runtime.auto_name("reducescatter", name, psid), shape=shape,
        dtype=code, output=ffi.from_buffer(out, require_writable=True) if out.size else ffi.NULL,
        reduce_op=resolve_op(op), prescale=prescale_factor, postscale=postscale_factor,
        process_set=psid, pieces=cptrs, piece_elements=ccounts,
        npieces=len(ptrs) or 1))  # (no pieces at all: an empty array, one empty piece)
    keep = (cptrs, ccounts, list(pieces), out)
    return Handle(hid, None, keep, "reducescatter", out)


def reducescatter_pieces(pieces, shape, dtype, op=Average, name=None, prescale_factor=1.0,
                         postscale_factor=1.0, process_set=None, out=None) -> np.ndarray:
    """``reducescatter_pieces_async`` and its result."""
    return synchronize(reducescatter_pieces_async(pieces, shape, dtype, op, name, prescale_factor,
                                                  postscale_factor, process_set, out))

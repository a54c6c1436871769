"""Grouped allreduce in the numpy API: a list of arrays negotiated and
fused as one unit, with one handle. The layout of a group (dtype codes,
shapes and data pointers as C arrays) is cached by the arrays' identities, so
a training loop that reduces the same arrays step after step pays for it
once."""
from __future__ import annotations

import weakref

import numpy as np

from . import runtime
from ._lib import check, ffi, lib
from .dtypes import dtype_code
from .handle import Handle, synchronize
from .ops import as_input, check_output, check_result_like, resolve_op
from .process_sets import process_set_id as _psid


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None, out=None) -> Handle:
    """Starts reducing a list of tensors as one unit: they are negotiated
    together and fused. One handle; synchronize returns the list of results
    (views of one new buffer), or with ``out`` (a list of arrays, each
    C-contiguous, writable and like its input) writes them there and returns
    ``out``."""
    ins = tensors if isinstance(tensors, list) else list(tensors)
    layout = _cached_layout(ins, inplace=False)  # (its arrays were checked)
    if layout is None:
        ins = [as_input(t) for t in ins]
        layout = _layout_for(ins, inplace=False)
    if out is not None:
        out = list(out)
        if len(out) != len(ins):
            raise ValueError(f"grouped_allreduce: out has {len(out)} arrays for {len(ins)} tensors")
        out = [check_result_like(o, i, f"grouped_allreduce (tensor {k})")
               for k, (o, i) in enumerate(zip(out, ins))]
    return _grouped(ins, False, layout, average, name, op, prescale_factor, postscale_factor,
                    process_set, out)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None) -> Handle:
    """In-place grouped allreduce: results are written into the tensors."""
    outs = tensors if isinstance(tensors, list) else list(tensors)
    return _grouped(outs, True, _layout_for(outs, inplace=True), average, name, op, prescale_factor,
                    postscale_factor, process_set)


def _pointers(arrays):
    """The data pointers of ``arrays`` as one C array of bare addresses (the
    caller keeps the arrays alive)."""
    return ffi.new("void*[]", [ffi.cast("void*", ffi.from_buffer(a)) if a.size else ffi.NULL
                               for a in arrays] or [ffi.NULL])


class _GroupLayout:
    """The flat description of a list of arrays that the core's group call
    takes (dtype codes, ranks, dimensions, data pointers). It refers to the
    arrays weakly (a cached layout must not keep a model's worth of arrays
    alive): a request keeps its arrays alive through its handle."""

    __slots__ = ("refs", "shapes", "dtypes", "ndims", "dims", "ptrs", "out_offsets", "out_specs",
                 "out_bytes", "uniform")

    def __init__(self, arrays):
        self.refs = [weakref.ref(a) for a in arrays]
        self.shapes = [a.shape for a in arrays]
        self.dtypes = ffi.new("int32_t[]", [dtype_code(a.dtype) for a in arrays] or [0])
        self.ndims = ffi.new("int32_t[]", [len(s) for s in self.shapes] or [0])
        self.dims = ffi.new("int64_t[]", [d for s in self.shapes for d in s] or [0])
        self.ptrs = _pointers(arrays)
        # Out of place: every result in one buffer, at 64-byte aligned offsets.
        offsets, at = [], 0
        for a in arrays:
            offsets.append(at)
            at += (a.nbytes + 63) // 64 * 64
        self.out_offsets = np.array(offsets, dtype=np.int64)
        self.out_specs = [(a.shape, a.dtype, o) for a, o in zip(arrays, offsets)]
        self.out_bytes = max(1, at)
        first = arrays[0] if arrays else None
        self.uniform = first is not None and first.nbytes % 64 == 0 and all(
            a.shape == first.shape and a.dtype == first.dtype for a in arrays)

    def outputs(self):
        """New result arrays (views of one new buffer) for the arrays of this
        layout, and the C array of their addresses (with what keeps it valid)."""
        buf = np.empty(self.out_bytes + 64, dtype=np.uint8)
        address = buf.ctypes.data
        base = -address % 64  # (aligned like the inputs)
        if self.uniform:  # (rows of one array: much cheaper than an array each)
            shape, dtype, _ = self.out_specs[0]
            outs = list(np.ndarray((len(self.out_specs),) + shape, dtype, buf, base))
        else:
            outs = [np.ndarray(shape, dtype, buf, base + o) for shape, dtype, o in self.out_specs]
        addresses = self.out_offsets + (address + base)
        return outs, (ffi.cast("void**", ffi.from_buffer(addresses)), addresses, buf)

    def still_valid(self, arrays) -> bool:
        """The same arrays (alive: their ids were not reused), same shapes."""
        return all(r() is a and a.shape == s for r, a, s in zip(self.refs, arrays, self.shapes))


# Layouts of groups by the identities of their arrays: training loops reduce
# the same gradient buffers every step, and describing 100+ arrays to the
# core costs more than reducing them.
_layout_cache: dict = {}
_LAYOUT_CACHE_SIZE = 64


def _cached_layout(arrays, inplace: bool) -> _GroupLayout | None:
    layout = _layout_cache.get((inplace, *map(id, arrays)))
    return layout if layout is not None and layout.still_valid(arrays) else None


def _layout_for(arrays, inplace: bool) -> _GroupLayout:
    """The layout of a group's inputs (already checked by as_input; in place
    they are the outputs too, checked writable here), built when first seen,
    then cached."""
    key = (inplace, *map(id, arrays))
    layout = _layout_cache.get(key)
    if layout is None or not layout.still_valid(arrays):
        if inplace:
            for a in arrays:
                check_output(a, "grouped_allreduce_")
        layout = _GroupLayout(arrays)
        if len(_layout_cache) >= _LAYOUT_CACHE_SIZE:
            _layout_cache.pop(next(iter(_layout_cache)))
        _layout_cache[key] = layout
    return layout


def _grouped(ins, inplace: bool, src: _GroupLayout, average, name, op, prescale, postscale,
             process_set, out=None) -> Handle:
    """Submits a group described by ``src`` (the layout of ``ins``); in place
    the results go into ``ins``, else into ``out`` (checked) or new arrays."""
    runtime.require_init()
    rop = resolve_op(op, average)
    psid = _psid(process_set)
    base = runtime.auto_name("allreduce", name, psid)
    if inplace:
        outs, dst = ins, src.ptrs
        keep = dst
    elif out is not None:
        outs = out
        dst = keep = _pointers(out)
    else:  # (outputs: the inputs' dtypes and shapes)
        outs, keep = src.outputs()
        dst = keep[0]
    hid = ffi.new("int64_t*")
    check(lib.commlib_enqueue_allreduce_group(base.encode(), len(ins), src.dtypes, src.ndims,
                                              src.dims, src.ptrs, dst, rop, float(prescale),
                                              float(postscale), psid, hid))
    return Handle(hid[0], None, (src, keep, ins, outs), "grouped_allreduce", outs)


def grouped_allreduce(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, out=None) -> list[np.ndarray]:
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                               postscale_factor, process_set, out))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None) -> list[np.ndarray]:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))

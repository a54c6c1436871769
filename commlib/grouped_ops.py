"""Grouped allreduce in the numpy API: a list of arrays negotiated and
fused as one unit, with one handle. The layout of a group (dtype codes,
shapes and data pointers as C arrays) is cached by the arrays' identities, so
a training loop that reduces the same arrays step after step pays for it
once."""
from __future__ import annotations

import weakref

import numpy as np

from . import runtime
from .checks import tensor_group
from ._lib import ffi, lib
from .dtypes import dtype_code
from .handle import Handle, synchronize
from .ops import as_input, check_output, check_result_like, resolve_op
from .process_sets import process_set_id as _psid
from .refusals import refused
from .submit import c_name, request, submit


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None, out=None) -> Handle:
    """Starts reducing a list of tensors as one unit: they are negotiated
    together and fused. One handle; synchronize returns the list of results
    (views of one new buffer), or with ``out`` (a list of arrays, each
    C-contiguous, writable and like its input) writes them there and returns
    ``out``."""
    mark = runtime.generated
    try:
        ins = tensors if isinstance(tensors, list) else tensor_group(tensors, "grouped_allreduce")
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
    except (TypeError, ValueError) as e:
        refused(e, "allreduce", name, process_set, mark)
        raise


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None) -> Handle:
    """In-place grouped allreduce: results are written into the tensors."""
    mark = runtime.generated
    try:
        outs = tensors if isinstance(tensors, list) else tensor_group(tensors, "grouped_allreduce_")
        return _grouped(outs, True, _layout_for(outs, inplace=True), average, name, op, prescale_factor,
                        postscale_factor, process_set)
    except (TypeError, ValueError) as e:
        refused(e, "allreduce", name, process_set, mark)
        raise


def _pointers(arrays):
    """The data pointers of ``arrays`` as one C array of bare addresses (the
    caller keeps the arrays alive)."""
    return ffi.new("void*[]", [ffi.cast("void*", ffi.from_buffer(a)) if a.size else ffi.NULL
                               for a in arrays] or [ffi.NULL])


class GroupLayout:
    """The flat description of a list of buffers that a group request takes
    (dtype codes, ranks, dimensions, data pointers), from each buffer's dtype
    code, shape, address and size in bytes (a frontend describes its tensors
    so, numpy arrays through ``of_arrays``). It refers to the buffers weakly
    (a cached layout must not keep a model's worth of them alive): a request
    keeps its buffers alive through its handle. ``request(...)`` is the group
    request on them (its arguments and result cached, as training loops
    repeat them)."""

    __slots__ = ("refs", "shapes", "codes", "dtypes", "ndims", "dims", "ptrs", "out_offsets",
                 "out_specs", "out_bytes", "uniform", "last", "facts")

    def __init__(self, buffers, codes, shapes, addresses, nbytes, dtypes=None):
        self.refs = [weakref.ref(b) for b in buffers]
        self.shapes = shapes
        self.codes = codes
        self.dtypes = ffi.new("int32_t[]", codes or [0])
        self.ndims = ffi.new("int32_t[]", [len(s) for s in shapes] or [0])
        self.dims = ffi.new("int64_t[]", [d for s in shapes for d in s] or [0])
        self.ptrs = self.pointers(addresses)
        # Out of place: every result in one buffer, at 64-byte aligned offsets.
        offsets, at = [], 0
        for n in nbytes:
            offsets.append(at)
            at += (n + 63) // 64 * 64
        self.out_offsets = np.array(offsets, dtype=np.int64)
        self.out_specs = list(zip(shapes, dtypes or codes, offsets))
        self.out_bytes = max(1, at)
        self.uniform = bool(shapes) and nbytes[0] % 64 == 0 and all(
            s == shapes[0] and c == codes[0] for s, c in zip(shapes, codes))
        self.last = None
        self.facts = None  # (a frontend's: what says its buffers still hold)

    @classmethod
    def of_arrays(cls, arrays):
        return cls(arrays, [dtype_code(a.dtype) for a in arrays], [a.shape for a in arrays],
                   [a.ctypes.data if a.size else 0 for a in arrays], [a.nbytes for a in arrays],
                   [a.dtype for a in arrays])

    def request(self, name, outputs, op: int, prescale: float, postscale: float, psid: int):
        """The group request (outputs: a C array of addresses, this layout's
        ptrs in place); the last one again when its arguments repeat."""
        args = (name, outputs, op, prescale, postscale, psid)
        last = self.last
        if last is not None and last[0] == args:
            return last[1]
        r = request(lib.COMMLIB_OP_ALLREDUCE, name, reduce_op=op, prescale=prescale,
                    postscale=postscale, process_set=psid, shape=self.dims,
                    nmembers=len(self.shapes), member_dtypes=self.dtypes,
                    member_ndims=self.ndims, member_inputs=self.ptrs, member_outputs=outputs)
        self.last = (args, r)
        return r

    @staticmethod
    def pointers(addresses):
        """Addresses (ints; 0: none) as a C array."""
        return ffi.new("void*[]", [ffi.cast("void*", a) if a else ffi.NULL for a in addresses] or [ffi.NULL])

    def out_addresses(self, base: int):
        """The C array of the results' addresses in one buffer at ``base``
        (and the numpy array that holds it)."""
        addresses = self.out_offsets + base
        return ffi.cast("void**", ffi.from_buffer(addresses)), addresses

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
        return outs, (*self.out_addresses(address + base), buf)

    def still_valid(self, arrays) -> bool:
        """The same arrays (alive: their ids were not reused), with the same
        shapes and dtypes (either can be changed in place)."""
        return all(r() is a and a.shape == s and a.dtype is d
                   for r, a, (s, d, _) in zip(self.refs, arrays, self.out_specs))


# Layouts of groups by the identities of their arrays: training loops reduce
# the same gradient buffers every step, and describing 100+ arrays to the
# core costs more than reducing them.
_layout_cache: dict = {}
_LAYOUT_CACHE_SIZE = 64


def _cached_layout(arrays, inplace: bool) -> GroupLayout | None:
    layout = _layout_cache.get((inplace, *map(id, arrays)))
    return layout if layout is not None and layout.still_valid(arrays) else None


def _layout_for(arrays, inplace: bool) -> GroupLayout:
    """The layout of a group's inputs (already checked by as_input; in place
    they are the outputs too, checked writable here), built when first seen,
    then cached."""
    key = (inplace, *map(id, arrays))
    layout = _layout_cache.get(key)
    # (a cached layout's arrays may have been made read-only since: refused
    # below, as on the first call)
    if (layout is None or not layout.still_valid(arrays)
            or (inplace and not all(a.flags.writeable for a in arrays))):
        if inplace:
            for a in arrays:
                check_output(a, "grouped_allreduce_")
        layout = GroupLayout.of_arrays(arrays)
        if len(_layout_cache) >= _LAYOUT_CACHE_SIZE:
            _layout_cache.pop(next(iter(_layout_cache)))
        _layout_cache[key] = layout
    return layout


def _grouped(ins, inplace: bool, src: GroupLayout, average, name, op, prescale, postscale,
             process_set, out=None) -> Handle:
    """Submits a group described by ``src`` (the layout of ``ins``); in place
    the results go into ``ins``, else into ``out`` (checked) or new arrays."""
    if inplace:
        outs, dst = ins, src.ptrs
        keep = dst
    elif out is not None:
        outs = out
        dst = keep = _pointers(out)
    else:  # (outputs: the inputs' dtypes and shapes)
        outs, keep = src.outputs()
        dst = keep[0]
    hid = submit_group(src, dst, average, name, op, prescale, postscale, process_set)
    return Handle(hid, None, (src, keep, ins, outs), "grouped_allreduce", outs)


def submit_group(src: GroupLayout, dst, average, name, op, prescale, postscale, process_set) -> int:
    """Submits the group ``src`` describes, results to the addresses ``dst``
    (a C array: src.ptrs in place); returns the handle id."""
    runtime.require_init()
    rop = resolve_op(op, average)
    psid = _psid(process_set)
    return submit(src.request(c_name("allreduce", name, psid), dst, rop, prescale, postscale, psid))


def grouped_allreduce(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, out=None) -> list[np.ndarray]:
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                               postscale_factor, process_set, out))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None) -> list[np.ndarray]:
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))

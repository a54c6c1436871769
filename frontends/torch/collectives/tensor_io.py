"""Torch tensors to and from the numpy arrays the core moves: which tensors
commlib.torch accepts (dense CPU and CUDA tensors of commlib.dtypes' table;
CUDA tensors are routed by cuda_dispatch) and the
zero-copy views both ways (bfloat16 through ml_dtypes)."""
from __future__ import annotations

import weakref
from operator import attrgetter

import numpy as np
import torch

from commlib import dtypes as _dtypes
from commlib.checks import check_has_rows, integer_splits, tensor_group
from commlib.ops import even_splits
from commlib.process_sets import set_size
from commlib.grouped_ops import GroupLayout
from commlib.submit import NULL, Facts, address

# commlib.dtypes' table, by name (torch builds without a dtype skip it)
SUPPORTED_DTYPES = tuple(getattr(torch, name) for name in _dtypes.SUPPORTED if hasattr(torch, name))
_CODE_OF = {getattr(torch, name): _dtypes.code_of(name) for name in _dtypes.SUPPORTED
            if hasattr(torch, name)}


def core_code(dtype):
    """The core's code of a torch dtype; None when commlib cannot move it."""
    return _CODE_OF.get(dtype)


def torch_dtype(code: int):
    """The torch dtype of a core dtype code (the inverse of core_code)."""
    for dtype, c in _CODE_OF.items():
        if c == code:
            return dtype
    raise TypeError(f"no torch dtype for the core's dtype code {code}")


_SUPPORTED_NAMES = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
_bf16 = None


def _bfloat16_dtype():
    global _bf16
    if _bf16 is None:
        try:
            import ml_dtypes
        except ImportError as e:  # pragma: no cover - depends on the install
            raise TypeError("bfloat16 tensors need the ml_dtypes package "
                            "(pip install ml_dtypes)") from e
        _bf16 = np.dtype(ml_dtypes.bfloat16)
    return _bf16


def check_tensor(tensor, what: str, inplace: bool = False) -> torch.Tensor:
    """Checks that commlib can move ``tensor``: a dense CPU or CUDA tensor of a
    supported dtype (and contiguous, when the result is written into it)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"{what}: tensor is on device {tensor.device}, but commlib.torch supports CPU and "
            "CUDA tensors only; move it with tensor.cpu()")
    if tensor.is_nested:
        raise TypeError(f"{what}: nested tensors are not supported; pass their components "
                        "(tensor.unbind()) or a padded dense tensor")
    if tensor.layout != torch.strided:
        raise TypeError(f"{what}: {tensor.layout} tensors are not supported; "
                        "use a dense tensor (tensor.to_dense())")
    if tensor.dtype not in SUPPORTED_DTYPES:
        hint = ""
        if tensor.dtype.itemsize == 1 and tensor.dtype.is_floating_point:  # (the float8 kinds)
            hint = ("; to move its bytes (allgather, broadcast, alltoall, send/recv), pass "
                    f"tensor.view(torch.uint8) and view the result back with .view({tensor.dtype})")
        raise TypeError(f"{what}: unsupported dtype {tensor.dtype}; commlib supports "
                        f"{_SUPPORTED_NAMES}{hint}")
    if inplace and not tensor.is_contiguous():
        raise ValueError(f"{what} writes its result into the tensor, which must be "
                         "contiguous; call tensor.contiguous() first")
    return tensor


def tensor_list(tensors, what: str) -> list:
    """The list of torch.Tensors a grouped collective was given (a list, a
    tuple or any iterable of them); TypeError for anything else, a single
    tensor included."""
    tensors = tensor_group(tensors, what)
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} expects a list of torch.Tensors, got {type(t).__name__} at index {i}")
    return tensors


def check_receive_target(out, device, what: str):
    """Checks where a receive puts its message: ``out`` (a tensor it writes
    into) or ``device`` (where a new tensor goes: a device commlib can reach),
    not both. Returns ``device`` as a torch.device (None when not given)."""
    if out is not None:
        if device is not None:
            raise ValueError(f"{what}: pass either out= or device=, not both (out's device is used)")
        check_tensor(out, what, inplace=True)
        return None
    if device is None:
        return None
    device = torch.device(device)
    check_tensor(torch.empty(0, device=device), what)  # (a device commlib can reach)
    return device


class TensorFacts(Facts):
    """commlib.submit.Facts of a checked contiguous CPU tensor, with what
    says it still holds: the tensor (weakly), its data address, dtype and
    shape (``tensor.data = ...`` or ``set_`` can change each)."""

    __slots__ = ("addr", "tdtype", "tshape")

    def __init__(self, tensor, code: int):
        shape = tuple(tensor.shape)
        self.addr, self.tdtype, self.tshape = tensor.data_ptr(), tensor.dtype, tensor.shape
        key = id(tensor)
        super().__init__(code, shape or (1,), address(self.addr) if tensor.numel() else NULL,
                         weakref.ref(tensor, lambda _r: _facts.pop(key, None)))

    def holds(self, t) -> bool:
        return (self.ref() is t and t.data_ptr() == self.addr and t.dtype is self.tdtype
                and t.shape == self.tshape and t.is_contiguous())


_facts: dict[int, TensorFacts] = {}
facts_of = _facts.get  # (id(tensor) -> its TensorFacts or None; check f.holds(tensor) before use)


def host_code(tensor):
    """The core's dtype code of a dense contiguous CPU tensor that commlib
    moves as it is; None for anything else (which takes the checked way)."""
    if not isinstance(tensor, torch.Tensor):
        return None
    code = _CODE_OF.get(tensor.dtype)
    if (code is None or not tensor.is_cpu or tensor.is_nested or tensor.layout is not torch.strided
            or not tensor.is_contiguous()):
        return None
    return code


def cached_facts(tensor):
    """The facts ``describe`` gave ``tensor`` when they still hold, else None."""
    f = _facts.get(id(tensor))
    return f if f is not None and f.holds(tensor) else None


def describe(tensor, what: str) -> TensorFacts:
    """The core's facts of a tensor written in place (commlib.submit.Facts:
    the dtype's code, ndim, the shape as a C array, the data pointer),
    checked as ``check_tensor(tensor, what, inplace=True)`` does, without a
    numpy view, and cached by the tensor's identity. 0-d tensors are
    described as 1-element 1-d ones."""
    f = _facts.get(id(tensor))
    if f is not None and f.holds(tensor):
        return f
    code = _CODE_OF.get(getattr(tensor, "dtype", None))
    if (code is None or not isinstance(tensor, torch.Tensor) or not tensor.is_cpu or tensor.is_nested
            or tensor.layout is not torch.strided or not tensor.is_contiguous()):
        check_tensor(tensor, what, inplace=True)  # (raises the error that applies)
        if not tensor.is_cpu:  # (a device pointer must never reach the host path)
            raise ValueError(f"{what}: a {tensor.device} tensor reached the host path; CUDA tensors "
                             "go through commlib.torch's collectives (cuda_dispatch)")
    if len(_facts) >= 8192:
        _facts.clear()
    f = _facts[id(tensor)] = TensorFacts(tensor, code)
    return f


_layouts: dict = {}
_data_ptr, _contiguous = torch.Tensor.data_ptr, torch.Tensor.is_contiguous
_shape, _dtype = attrgetter("shape"), attrgetter("dtype")


def _group_facts(tensors) -> tuple:
    """What a group layout of ``tensors`` depends on: their addresses, shapes
    and dtypes (with contiguity and identity, checked apart)."""
    return list(map(_data_ptr, tensors)), list(map(_shape, tensors)), list(map(_dtype, tensors))


def _layout_holds(layout, tensors) -> bool:
    """Whether a cached layout still describes ``tensors`` (TensorFacts.holds
    for each, one property at a time over the whole list: a group of 128
    tensors is checked in a third of the time)."""
    return (_group_facts(tensors) == layout.facts and all(map(_contiguous, tensors))
            and all([ref() is t for ref, t in zip(layout.refs, tensors)]))


def group_layout(tensors, what: str, inplace: bool) -> GroupLayout | None:
    """The group layout (commlib.grouped_ops.GroupLayout) of contiguous CPU
    tensors, each checked (check_tensor), cached by their identities; None
    when one is not contiguous (out of place: the caller copies it)."""
    key = (inplace, *map(id, tensors))
    layout = _layouts.get(key)
    if layout is not None and _layout_holds(layout, tensors):
        return layout
    for t in tensors:
        check_tensor(t, what, inplace=inplace)
        if not t.is_cpu:
            raise ValueError(f"{what}: a {t.device} tensor reached the host path")
    if not all(t.is_contiguous() for t in tensors):
        return None
    facts = [describe(t, what) for t in tensors]
    layout = GroupLayout(tensors, [f.code for f in facts], [f.shape for f in facts],
                         [f.addr if t.numel() else 0 for f, t in zip(facts, tensors)],
                         [t.numel() * t.element_size() for t in tensors], [t.dtype for t in tensors])
    layout.facts = _group_facts(tensors)
    if len(_layouts) >= 64:
        _layouts.pop(next(iter(_layouts)))
    _layouts[key] = layout
    return layout


def group_outputs(layout, tensors):
    """New result tensors like ``tensors`` (their shapes) for an
    out-of-place group, and the C array of their addresses (with what keeps
    it valid)."""
    if layout.uniform:  # (one buffer of rows: one allocation, one unbind)
        t0 = tensors[0]
        buf = torch.empty((len(tensors),) + tuple(t0.shape), dtype=t0.dtype)
        return list(buf.unbind(0)), layout.out_addresses(buf.data_ptr())
    outs = [torch.empty(t.shape, dtype=t.dtype) for t in tensors]
    return outs, (GroupLayout.pointers([o.data_ptr() if o.numel() else 0 for o in outs]),)


def input_facts(tensor, what: str, rows_of: str | None = None):
    """The facts (TensorFacts) of a tensor an out-of-place collective reads,
    and the tensor it reads: cached ones when they still hold, else checked
    (check_tensor; a non-contiguous tensor is read through a contiguous copy).
    With ``rows_of`` (the collective's name) the tensor needs a dimension 0
    (check_has_rows)."""
    f = cached_facts(tensor)
    if f is not None and (rows_of is None or f.tshape):
        return f, tensor
    tensor = check_tensor(tensor, what)
    if rows_of is not None:
        check_has_rows(tensor.dim(), rows_of)
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return describe(tensor, what), tensor


def tensor_rows(f: TensorFacts):
    """commlib.ops.allgather_described's rows_view for a tensor's facts: its
    result (the core's bytes, shared) as a tensor of the input's dtype and
    trailing dimensions."""
    return rows_as_tensor(f.tdtype, tuple(f.tshape[1:]))


def rows_as_tensor(dtype, trailing: tuple):
    """A result's rows (the core's bytes, shared) as a tensor of ``dtype``
    and ``trailing`` dimensions: ``view(data, rows)``."""
    def view(data, rows):
        if not len(data):
            return torch.empty((rows,) + trailing, dtype=dtype)
        t = torch.frombuffer(data, dtype=dtype)
        return t.view(rows, *trailing) if trailing else t

    return view


def as_array(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's memory (no copy). 0-d
    tensors become 1-element 1-d views, which the core always handles."""
    t = tensor.detach()
    if t.dtype == torch.bfloat16:
        arr = t.view(torch.int16).numpy().view(_bfloat16_dtype())
    else:
        arr = t.numpy()
    return arr.reshape(1) if arr.ndim == 0 else arr


# The numpy dtypes torch.from_numpy takes as they are (a set lookup: dtype.name is slow).
_NATIVE = frozenset(np.dtype(name) for name in _dtypes.SUPPORTED if name != "bfloat16")


def as_tensor(arr: np.ndarray) -> torch.Tensor:
    """A tensor sharing the memory of a (writable) numpy array."""
    if arr.dtype in _NATIVE:
        return torch.from_numpy(arr)
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def records_grad(*tensors) -> bool:
    """Whether autograd records a call on ``tensors`` (grad mode on, one of
    them requiring grad). When it does not, the differentiable collectives
    skip their autograd function, whose own cost is 10-20 us a call."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


def input_array(tensor, what: str) -> np.ndarray:
    """A zero-copy array of ``tensor`` (a contiguous copy if it is not)."""
    t = check_tensor(tensor, what)
    return as_array(t if t.is_contiguous() else t.contiguous())


def split_list(splits, dim0: int, process_set) -> list[int]:
    """alltoall's send splits, checked: one non-negative entry per rank summing to dim0."""
    if splits is None:
        return even_splits(dim0, process_set)
    n = set_size(process_set)
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()  # (integer_splits refuses a float or 2-D one)
    out = integer_splits(splits)
    if len(out) != n:
        raise ValueError(f"splits has {len(out)} entries; it needs one per rank ({n})")
    if any(s < 0 for s in out) or sum(out) != dim0:
        raise ValueError(f"splits {out} must be non-negative and sum to dimension 0 ({dim0})")
    return out

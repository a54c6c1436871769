"""Torch tensors to and from the numpy arrays the core moves: which tensors
commlib.torch accepts (dense CPU and CUDA tensors of commlib.dtypes' table;
CUDA tensors are routed by cuda_dispatch) and the
zero-copy views both ways (bfloat16 through ml_dtypes)."""
from __future__ import annotations

import numpy as np
import torch

from commlib import dtypes as _dtypes
from commlib.ops import even_splits
from commlib.process_sets import set_size
from commlib.submit import NULL, address, shape_array

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
    if tensor.layout != torch.strided:
        raise TypeError(f"{what}: {tensor.layout} tensors are not supported; "
                        "use a dense tensor (tensor.to_dense())")
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{what}: unsupported dtype {tensor.dtype}; commlib supports "
                        f"{_SUPPORTED_NAMES}")
    if inplace and not tensor.is_contiguous():
        raise ValueError(f"{what} writes its result into the tensor, which must be "
                         "contiguous; call tensor.contiguous() first")
    return tensor


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


def describe(tensor, what: str):
    """The core's facts of a tensor written in place (the dtype's code, the
    number of dimensions, the shape as a C array, the data pointer), checked
    as ``check_tensor(tensor, what, inplace=True)`` does, without a numpy
    view. 0-d tensors are described as 1-element 1-d ones."""
    code = _CODE_OF.get(getattr(tensor, "dtype", None))
    if (code is None or not isinstance(tensor, torch.Tensor) or not tensor.is_cpu
            or tensor.layout is not torch.strided or not tensor.is_contiguous()):
        check_tensor(tensor, what, inplace=True)  # (raises the error that applies)
        if not tensor.is_cpu:  # (a device pointer must never reach the host path)
            raise ValueError(f"{what}: a {tensor.device} tensor reached the host path; CUDA tensors "
                             "go through commlib.torch's collectives (cuda_dispatch)")
    shape = tensor.shape or (1,)
    ptr = address(tensor.data_ptr()) if tensor.numel() else NULL
    return code, len(shape), shape_array(shape), ptr


def as_array(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's memory (no copy). 0-d
    tensors become 1-element 1-d views, which the core always handles."""
    t = tensor.detach()
    if t.dtype == torch.bfloat16:
        arr = t.view(torch.int16).numpy().view(_bfloat16_dtype())
    else:
        arr = t.numpy()
    return arr.reshape(1) if arr.ndim == 0 else arr


def as_tensor(arr: np.ndarray) -> torch.Tensor:
    """A tensor sharing the memory of a (writable) numpy array."""
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


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
        if splits.is_floating_point() or splits.dim() != 1:
            raise ValueError("splits must be a 1-D integer tensor, one entry per rank")
        splits = splits.tolist()
    out = [int(s) for s in splits]
    if len(out) != n:
        raise ValueError(f"splits has {len(out)} entries; it needs one per rank ({n})")
    if any(s < 0 for s in out) or sum(out) != dim0:
        raise ValueError(f"splits {out} must be non-negative and sum to dimension 0 ({dim0})")
    return out

"""numpy dtypes the core supports, and their codes."""
from __future__ import annotations

import numpy as np

from ._lib import lib

# bfloat16 has no numpy dtype of its own; ml_dtypes (used by TF and JAX)
# provides one, recognised here by name so that ml_dtypes stays optional.
_CODES = {
    "uint8": lib.COMMLIB_UINT8,
    "int8": lib.COMMLIB_INT8,
    "int32": lib.COMMLIB_INT32,
    "int64": lib.COMMLIB_INT64,
    "float16": lib.COMMLIB_FLOAT16,
    "bfloat16": lib.COMMLIB_BFLOAT16,
    "float32": lib.COMMLIB_FLOAT32,
    "float64": lib.COMMLIB_FLOAT64,
    "bool": lib.COMMLIB_BOOL,
    "int16": lib.COMMLIB_INT16,
    "uint16": lib.COMMLIB_UINT16,
    "uint32": lib.COMMLIB_UINT32,
    "uint64": lib.COMMLIB_UINT64,
}

SUPPORTED = tuple(_CODES)


def code_of(name: str) -> int:
    """The core's code of a dtype by its name in SUPPORTED (frontends map
    their own dtypes with it)."""
    return _CODES[name]


_BY_DTYPE: dict = {}  # np.dtype -> code, filled on first use (dtype.name is slow)


def dtype_code(dtype) -> int:
    """The core's code for dtype; TypeError for dtypes commlib cannot move."""
    code = _BY_DTYPE.get(dtype)
    if code is not None:
        return code
    dt = np.dtype(dtype)
    code = _CODES.get(dt.name)
    if code is None or dt.byteorder == ">":
        raise TypeError(f"unsupported dtype {dt}; commlib supports {', '.join(SUPPORTED)}")
    _BY_DTYPE[dt] = code
    return code


def dtype_size(code: int) -> int:
    """Bytes per element of one of the core's dtype codes."""
    for name, c in _CODES.items():
        if c == code:
            return 2 if name == "bfloat16" else np.dtype(name).itemsize
    raise ValueError(f"unknown dtype code {code}")


def numpy_dtype(code: int) -> np.dtype:
    """The numpy dtype of one of the core's dtype codes (bfloat16 needs ml_dtypes)."""
    for name, c in _CODES.items():
        if c == code:
            if name == "bfloat16":
                import ml_dtypes

                return np.dtype(ml_dtypes.bfloat16)
            return np.dtype(name)
    raise ValueError(f"unknown dtype code {code}")

"""Argument checks that the numpy API and every frontend make alike, written
once: the same exception type and message whichever path a call takes.
Nothing here imports a framework."""
from __future__ import annotations

import numpy as np

from .errors import ScalarTensorError

SPLITS_NOT_INTEGERS = "splits must be a 1-D sequence of integers, one per rank"


def check_has_rows(ndim, what: str, several: bool = False) -> None:
    """ScalarTensorError (a ValueError) for a 0-d tensor (``ndim`` 0) given to
    a collective along dimension 0 (allgather, alltoall, reducescatter);
    ``several``: one of a group's tensors."""
    if ndim == 0:
        raise ScalarTensorError(f"{what} needs {'tensors' if several else 'a tensor'} with at least "
                                "one dimension, got a 0-d tensor")


def integer(value, what: str) -> int:
    """An integer argument (an int or a numpy integer) as an int; TypeError
    naming ``what`` for anything else: a bool, a float (1.5 would be
    truncated), a string (int("2") would parse it)."""
    if type(value) is int:
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    raise TypeError(f"{what} must be an integer, got {type(value).__name__}")


def positive_count(value, what: str) -> int:
    """``integer(value, what)``, and ValueError when it is below 1."""
    out = integer(value, what)
    if out < 1:
        raise ValueError(f"{what} must be a positive integer, got {out}")
    return out


def compressor(compression):
    """``compression`` when it is a compressor (``compress`` and
    ``decompress``, as Compression.none and Compression.fp16 have);
    TypeError otherwise, when an optimizer is made rather than at its first
    gradient."""
    if callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None)):
        return compression
    raise TypeError(f"compression must be a compressor with compress() and decompress() "
                    f"(Compression.none, Compression.fp16, ...), got {type(compression).__name__}")


def scale_factor(value, which: str) -> float:
    """A prescale/postscale factor as a float. TypeError naming ``which``
    for a string (float("2") would parse it), a bool or anything float()
    refuses (None, a complex number); numpy and framework scalars are
    taken. (The core refuses a factor that is not finite.)"""
    if type(value) is float:
        return value
    if not isinstance(value, (str, bytes, bool)):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
        except OverflowError as e:  # (an int beyond a double: a ValueError, which the other ranks are told of)
            raise ValueError(f"{which} is out of a float's range ({e})") from None
    raise TypeError(f"{which} must be a real number, got {type(value).__name__}")


def scale_factors(prescale, postscale) -> tuple[float, float]:
    """Both factors of a reduction through ``scale_factor``."""
    return scale_factor(prescale, "prescale_factor"), scale_factor(postscale, "postscale_factor")


def tensor_group(tensors, what: str) -> list:
    """The argument of a grouped collective, a list (a tuple, any iterable)
    of tensors, as a list (a generator is read once); TypeError for a single
    tensor or array (anything with a shape), a string or something not
    iterable, before anything is sent (a tensor would otherwise be taken as
    the list of its rows)."""
    if hasattr(tensors, "shape") or isinstance(tensors, (str, bytes)) or not hasattr(tensors, "__iter__"):
        raise TypeError(f"{what} takes a list of tensors, got {type(tensors).__name__}; "
                        "for one tensor, pass [tensor]")
    return list(tensors)


def integer_splits(splits) -> list[int]:
    """alltoall's and reducescatter's splits (a 1-D sequence or array of
    integers, each within int64) as ints; ValueError for anything else,
    floats included (4.5 rows is not a count, and 4.0 is refused alike
    rather than truncated)."""
    s = np.asarray(splits)
    if s.ndim != 1 or not np.issubdtype(s.dtype, np.integer):
        raise ValueError(SPLITS_NOT_INTEGERS)
    out = [int(x) for x in s]
    if any(x < -_INT64_LIMIT or x >= _INT64_LIMIT for x in out):  # (uint64 ones; the core takes int64)
        raise ValueError(f"splits {out}: an entry is beyond the range of a row count (int64)")
    return out


_INT64_LIMIT = 2 ** 63

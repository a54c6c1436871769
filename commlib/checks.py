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
    """alltoall's splits (a 1-D sequence or array of integers) as ints;
    ValueError for anything else, floats included (4.5 rows is not a count,
    and 4.0 is refused alike rather than truncated)."""
    s = np.asarray(splits)
    if s.ndim != 1 or not np.issubdtype(s.dtype, np.integer):
        raise ValueError(SPLITS_NOT_INTEGERS)
    return [int(x) for x in s]

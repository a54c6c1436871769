"""Reused, aligned numpy buffers for the results of collectives inside
TensorFlow ops.

A fresh result array every step costs more than the collective's own copies
on big tensors: the first touch of each 4 KiB page faults (about 25 ms a
step for 50 MB of gradients on the test VM), and TensorFlow copies an op's
numpy output into a tensor of its own unless the array is 64-byte aligned,
in which case the tensor uses the array's memory. So results live in
aligned buffers that are reused while nothing else refers to them any more:
a reference count above the pool's own means a tensor (or a caller) still
uses the memory, and a set in use is never handed out again.
"""
from __future__ import annotations

import collections
import sys
import threading

import numpy as np

ALIGN = 64  # TensorFlow shares an ndarray's memory with a tensor when it is this aligned


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised array of ``shape`` whose data is ALIGN-byte aligned."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def unshared(arrays) -> bool:
    """Whether nothing but the caller's list refers to these arrays
    (aligned_empty's): 3 references to each (the list, the loop variable,
    getrefcount's argument) and 2 to the memory they view (the array, the
    argument), which also counts views of it, whose base is that memory."""
    return all(sys.getrefcount(a) <= 3 and sys.getrefcount(a.base) <= 2 for a in arrays)


class OutputPool:
    """Result buffers by layout (shapes and dtypes): up to ``per_layout`` sets
    of each of the ``layouts`` most recently used layouts."""

    def __init__(self, layouts: int = 32, per_layout: int = 2):
        self._sets: collections.OrderedDict = collections.OrderedDict()
        self._layouts, self._per_layout = layouts, per_layout
        self._lock = threading.Lock()

    def take(self, like) -> list:
        """Buffers shaped like the arrays ``like``: a new list (holding it
        marks the set in use) of a released set, or of new buffers."""
        key = tuple((a.shape, a.dtype.str) for a in like)
        with self._lock:
            sets = self._sets.pop(key, [])
            self._sets[key] = sets  # (most recently used last)
            found = next((list(s) for s in sets if unshared(s)), None)
            if found is None:
                found = [aligned_empty(a.shape, a.dtype) for a in like]
                if len(sets) < self._per_layout:
                    sets.append(list(found))
            while len(self._sets) > self._layouts:
                self._sets.popitem(last=False)
            return found


outputs = OutputPool()

"""Python objects across ranks: ``broadcast_object`` and ``allgather_object``.

Framework-free (numpy only); the framework frontends re-export them with
Horovod's signatures::

    import commlib
    from commlib.objects import broadcast_object, allgather_object
    commlib.init()
    config = broadcast_object({"lr": 0.1} if commlib.rank() == 0 else None, root_rank=0)
    everyone = allgather_object(commlib.rank())          # [0, 1, ..., size-1]

Objects travel pickled (cloudpickle when installed, so lambdas and local
classes work, as in Horovod) as uint8 arrays; sizes go first, so ranks do not
need to know the payload length in advance. Like every collective, all ranks
(of ``process_set``, when one is given: then only its members call them, and
``root_rank`` is a job rank in the set) must call these in the same order (or
pass the same ``name``).
"""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from . import ops, runtime
from .ops import auto_name, check_root
from .process_sets import check_process_set

try:  # cloudpickle output is readable by pickle.loads
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - cloudpickle is optional
    _pickler = pickle


def dumps(obj: Any) -> np.ndarray:
    """``obj`` pickled into a 1-D uint8 array."""
    return np.frombuffer(_pickler.dumps(obj), dtype=np.uint8)


def loads(payload: np.ndarray) -> Any:
    return pickle.loads(np.ascontiguousarray(payload, dtype=np.uint8).tobytes())


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set=None) -> Any:
    """Rank ``root_rank``'s ``obj`` on every rank (of ``process_set``); the
    root gets its own object back, the others an unpickled copy."""
    process_set = check_process_set(process_set)
    check_root(root_rank, process_set)
    base = auto_name("broadcast_object", name, process_set)
    is_root = runtime.rank() == root_rank
    payload = dumps(obj) if is_root else None
    size = np.array([payload.size if is_root else 0], dtype=np.int64)
    size = ops.broadcast(size, root_rank, name=f"{base}.size", process_set=process_set)
    if not is_root:
        payload = np.empty(int(size[0]), dtype=np.uint8)
    payload = ops.broadcast(payload, root_rank, name=f"{base}.data", process_set=process_set)
    return obj if is_root else loads(payload)


def allgather_object(obj: Any, name: str | None = None, process_set=None) -> list:
    """The list of every rank's ``obj`` (of ``process_set``), in rank order."""
    process_set = check_process_set(process_set)
    base = auto_name("allgather_object", name, process_set)
    payload = dumps(obj)
    sizes = ops.allgather(np.array([payload.size], dtype=np.int64), name=f"{base}.sizes",
                          process_set=process_set)
    data = ops.allgather(payload, name=f"{base}.data", process_set=process_set)
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(loads(data[offset:offset + n]))
        offset += n
    return out

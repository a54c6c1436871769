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
need to know the payload length in advance. An object that cannot be pickled
fails on every rank, not only on its own: its rank raises the pickler's error,
the others ``pickle.PicklingError`` naming that rank and the reason (nobody
waits for data that never comes). A ``root_rank`` that one rank alone
refuses fails the others' call at once too (CollectiveMismatchError, see
``commlib.refusals``). Like every collective, all ranks
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
from .process_sets import check_process_set, members
from .refusals import refused

try:  # cloudpickle output is readable by pickle.loads
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - cloudpickle is optional
    _pickler = pickle


def dumps(obj: Any) -> np.ndarray:
    """``obj`` pickled into a 1-D uint8 array."""
    return np.frombuffer(_pickler.dumps(obj), dtype=np.uint8)


def loads(payload: np.ndarray) -> Any:
    return pickle.loads(np.ascontiguousarray(payload, dtype=np.uint8).tobytes())


def _pickled(obj: Any):
    """``(payload, None, its size)``, or ``(the reason as bytes, the
    exception, -1 - the reason's length)`` when ``obj`` cannot be pickled:
    the size, sent first, tells the other ranks which."""
    try:
        payload = dumps(obj)
        return payload, None, payload.size
    except Exception as e:  # noqa: BLE001 - whatever the pickler raises, every rank hears of it
        reason = np.frombuffer(f"{type(e).__name__}: {e}".encode(errors="replace"), dtype=np.uint8)
        return reason, e, -1 - reason.size


def _reason(payload: np.ndarray) -> str:
    return payload.tobytes().decode(errors="replace")


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set=None) -> Any:
    """Rank ``root_rank``'s ``obj`` on every rank (of ``process_set``); the
    root gets its own object back, the others an unpickled copy."""
    mark = runtime.generated
    try:
        process_set = check_process_set(process_set)
        check_root(root_rank, process_set)
        base = auto_name("broadcast_object", name, process_set)
    except (TypeError, ValueError) as e:  # (the others wait in "<base>.size" first)
        refused(e, "broadcast_object", name, process_set, mark, parts=[("broadcast", ".size")])
        raise
    is_root = runtime.rank() == root_rank
    payload, error, n = _pickled(obj) if is_root else (None, None, 0)
    size = ops.broadcast(np.array([n], dtype=np.int64), root_rank, name=f"{base}.size",
                         process_set=process_set)
    n = int(size[0])
    if not is_root:
        payload = np.empty(n if n >= 0 else -1 - n, dtype=np.uint8)
    payload = ops.broadcast(payload, root_rank, name=f"{base}.data", process_set=process_set)
    if n < 0:
        if error is not None:
            raise error
        raise pickle.PicklingError(f"broadcast_object: rank {root_rank} could not pickle its object "
                                   f"({_reason(payload)})")
    return obj if is_root else loads(payload)


def allgather_object(obj: Any, name: str | None = None, process_set=None) -> list:
    """The list of every rank's ``obj`` (of ``process_set``), in rank order."""
    process_set = check_process_set(process_set)
    base = auto_name("allgather_object", name, process_set)
    payload, error, n = _pickled(obj)
    sizes = ops.allgather(np.array([n], dtype=np.int64), name=f"{base}.sizes",
                          process_set=process_set)
    data = ops.allgather(payload, name=f"{base}.data", process_set=process_set)
    parts, offset = [], 0
    for k in sizes.tolist():
        length = k if k >= 0 else -1 - k
        parts.append((k >= 0, data[offset:offset + length]))
        offset += length
    if any(not ok for ok, _ in parts):
        if error is not None:
            raise error
        ranks = members(process_set)
        failed = "; ".join(f"rank {ranks[i]}: {_reason(p)}" for i, (ok, p) in enumerate(parts) if not ok)
        raise pickle.PicklingError(f"allgather_object: some ranks could not pickle their objects ({failed})")
    return [loads(p) for _, p in parts]

"""Framework-free logic shared by the framework frontends (commlib.torch,
commlib.tensorflow): Horovod's argument conventions for reduction ops and
gradient scaling, explicit gradient groups, collective names, the
process-set placeholder, and Horovod's build/topology queries.

Nothing here imports a framework; tensors are opaque objects.
"""
from __future__ import annotations

import collections
import itertools
import warnings
from typing import Any, Callable, Sequence

from . import basics, ops


# The Adasum marker and op resolution belong to the core API (commlib.ops);
# the marker is re-exported here, resolve_op below wraps ops.resolve_op.
Adasum = ops.Adasum
_OPS = {ops.Sum: "Sum", ops.Average: "Average", ops.Min: "Min", ops.Max: "Max",
        ops.Product: "Product"}


def op_name(op: int) -> str:
    return _OPS.get(op, repr(op))


def resolve_op(op=None, average=None, default=ops.Average) -> int:
    """``commlib.ops.resolve_op`` (Adasum refused, unknown ops refused), plus
    Horovod's DeprecationWarning when the deprecated ``average`` is used."""
    resolved = ops.resolve_op(op, average, default)
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed",
                      DeprecationWarning, stacklevel=3)
    return resolved


_name_counters = collections.defaultdict(itertools.count)


def auto_name(kind: str, name=None) -> str:
    """``name`` (checked), or the next ``<kind>.noname.<n>``: ranks that make
    the same calls in the same order generate the same names."""
    if name is None:
        return f"{kind}.noname.{next(_name_counters[kind])}"
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    return name


# broadcast's root check (TypeError/ValueError), for frontends that check
# before tracing or sending.
check_root = ops._check_root


def even_splits(rows: int) -> list[int]:
    """alltoall's splits when none are given: dimension 0 in equal parts,
    one per rank."""
    n = basics.size()
    if rows % n:
        raise ValueError(f"alltoall without splits needs dimension 0 ({rows}) divisible by the "
                         f"number of ranks ({n}); pass splits for an uneven division")
    return [rows // n] * n


def predivide_scales(op: int, gradient_predivide_factor: float) -> tuple[float, float]:
    """(prescale, postscale) for gradient averaging split around the sum, as
    Horovod's ``gradient_predivide_factor``: gradients are scaled by
    1/f before the sum and f/size after it (the core's Average divides by
    size)."""
    f = float(gradient_predivide_factor)
    if f == 1.0:
        return 1.0, 1.0
    if op != ops.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if f <= 0:
        raise ValueError(f"gradient_predivide_factor must be positive, got {f}")
    return 1.0 / f, f


def resolve_groups(num_groups: int = 0, groups=None):
    """Horovod's ``num_groups``/``groups`` pair to one value: None, a positive
    int (split the gradients into that many groups) or a list of lists of
    variables."""
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`", DeprecationWarning,
                      stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None:
        if isinstance(groups, bool) or not (isinstance(groups, (list, tuple)) or
                                            (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a positive integer or a list of lists of variables")
    return groups


def split_list(items: Sequence, n: int) -> list[list]:
    """``items`` in n contiguous parts of nearly equal length (Horovod's)."""
    d, r = divmod(len(items), n)
    return [list(items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)]) for i in range(n)]


def group_indices(present: Sequence[int], groups, key_of: Callable[[int], Any],
                  group_keys: Callable[[Any], Any] | None = None) -> list[list[int]]:
    """Partitions the gradient indices ``present`` into allreduce groups.

    groups None: one group (one grouped allreduce for everything);
    int n: n contiguous groups; list of lists of variables: those groups
    (matched by ``key_of(index)`` == ``group_keys(variable)``), every index in
    no list forming a group of its own. Empty groups are dropped.
    """
    present = list(present)
    if groups is None:
        return [present] if present else []
    if isinstance(groups, int):
        return [g for g in split_list(present, min(groups, max(len(present), 1))) if g]
    group_keys = group_keys or (lambda v: v)
    where = {}
    for gi, group in enumerate(groups):
        for var in group:
            where.setdefault(group_keys(var), gi)
    split: list[list[int]] = [[] for _ in groups]
    alone = []
    for i in present:
        gi = where.get(key_of(i))
        if gi is None:
            alone.append([i])
        else:
            split[gi].append(i)
    return [g for g in split if g] + alone


class GlobalProcessSet:
    """Placeholder for Horovod's ``global_process_set``: commlib has no
    process sets yet, so the frontends accept only this object (or None)
    wherever Horovod takes ``process_set=``."""

    process_set_id = 0

    def size(self) -> int:
        return basics.size()

    def rank(self) -> int:
        return basics.rank()

    def included(self) -> bool:
        return True

    @property
    def ranks(self) -> list[int]:
        return list(range(basics.size()))

    def __repr__(self) -> str:
        return "ProcessSet(global)"


global_process_set = GlobalProcessSet()


def check_process_set(process_set) -> None:
    """Refuses anything but the global process set, before anything is sent."""
    if process_set is None or isinstance(process_set, GlobalProcessSet):
        return
    if getattr(process_set, "process_set_id", None) == 0:
        return
    raise NotImplementedError("commlib does not support process sets yet; only the global "
                              "process set (process_set=None) is available")


def add_process_set(process_set):
    raise NotImplementedError("commlib does not support process sets yet")


def remove_process_set(process_set):
    raise NotImplementedError("commlib does not support process sets yet")


# ------------------------------------------------------------ Horovod's basics

def init(comm=None, process_sets=None) -> None:
    """Starts commlib on every rank (collective). ``comm``: an optional mpi4py
    communicator. Process sets are not supported: process_sets must be None."""
    if process_sets:
        raise NotImplementedError("commlib does not support process sets yet")
    basics.init(comm)


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return basics.size() == basics.local_size() * basics.cross_size()


def mpi_enabled() -> bool:
    """MPI carries all of commlib's communication (always, today)."""
    return True


def mpi_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    """The NCCL version compiled in, as Horovod reports it: 0, none yet."""
    return 0


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False


def start_timeline(file_path, mark_cycles=False):
    """Not available yet: commlib has no timeline."""
    raise NotImplementedError("commlib has no timeline yet (start_timeline/stop_timeline)")


def stop_timeline():
    """Not available yet: commlib has no timeline."""
    raise NotImplementedError("commlib has no timeline yet (start_timeline/stop_timeline)")


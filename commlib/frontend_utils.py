"""Framework-free logic shared by the framework frontends (commlib.torch,
commlib.tensorflow): Horovod's argument conventions for reduction ops and
gradient scaling, explicit gradient groups, collective names, process sets
(the core's ProcessSet re-exported, with the checks and per-set sizes the
frontends need), and Horovod's build/topology queries.

Nothing here imports a framework; tensors are opaque objects.
"""
from __future__ import annotations

import collections
import itertools
import warnings
from typing import Any, Callable, Sequence

from . import basics, ops
from . import process_sets as _ps
from .process_sets import (  # noqa: F401 - re-exported by the frontends
    ProcessSet, add_process_set, global_process_set, remove_process_set)


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


# Per-kind and per-process-set counters (as commlib.ops' own): the members of
# a set generate matching names without advancing other ranks' counters.
_name_counters = collections.defaultdict(itertools.count)


def auto_name(kind: str, name=None, process_set=None) -> str:
    """``name`` (checked), or the next ``<kind>.noname.<n>`` of ``process_set``
    (default the global set): ranks that make the same calls on a set in the
    same order generate the same names. A set is checked (registered, this
    rank a member) before its counter moves."""
    if name is None:
        psid = _ps.process_set_id(process_set)
        return f"{kind}.noname.{next(_name_counters[kind, psid])}"
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    return name


def check_root(root_rank, process_set=None) -> int:
    """broadcast's root check (TypeError/ValueError), for frontends that check
    before tracing or sending: an int, a rank of the job, a member of
    ``process_set`` when one is given (root_rank is a job rank, as in
    Horovod)."""
    return ops._check_root(root_rank, process_set)


def even_splits(rows: int, process_set=None) -> list[int]:
    """alltoall's splits when none are given: dimension 0 in equal parts,
    one per rank (of ``process_set``)."""
    n = set_size(process_set)
    if rows % n:
        raise ValueError(f"alltoall without splits needs dimension 0 ({rows}) divisible by the "
                         f"number of ranks ({n}); pass splits for an uneven division")
    return [rows // n] * n


# The rows of dimension 0 that reducescatter leaves on this rank.
reducescatter_rows = ops.reducescatter_rows


def predivide_scales(op: int, gradient_predivide_factor: float) -> tuple[float, float]:
    """(prescale, postscale) for gradient averaging split around the sum, as
    Horovod's ``gradient_predivide_factor``: gradients are scaled by
    1/f before the sum and f/size after it (the core's Average divides by
    the size of the process set)."""
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


# ------------------------------------------------------------ process sets

def check_process_set(process_set, member: bool = True):
    """``process_set`` checked before anything is traced or sent, and returned
    (None: the global set). TypeError for anything but a ProcessSet,
    ValueError for a set that is not registered (add_process_set) and, when
    ``member``, for a set this rank does not belong to: only members may call
    collectives on a set. ``member=False`` is for objects every rank builds
    with the set (Horovod's DistributedOptimizer/DistributedGradientTape), which
    only reduce on members."""
    if process_set is None:
        return global_process_set
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a ProcessSet (commlib.ProcessSet, "
                        f"global_process_set), got {type(process_set).__name__}")
    if not _ps.is_registered(process_set):
        raise ValueError(f"{process_set} is not registered; call add_process_set() (or "
                         "init(process_sets=[...])) on every rank first")
    if member:
        _ps.process_set_id(process_set)  # ValueError for a non-member
    return process_set


def set_size(process_set=None) -> int:
    """The number of ranks of ``process_set`` (default: the job)."""
    return len(_ps.members(process_set))


def set_rank(process_set=None) -> int:
    """This rank's position in ``process_set`` (its rank in the job for the
    global set); ValueError when it is not a member."""
    ranks = _ps.members(process_set)
    me = basics.rank()
    if me not in ranks:
        raise ValueError(f"rank {me} is not a member of {process_set}")
    return ranks.index(me)


def included(process_set=None) -> bool:
    """Whether this rank belongs to ``process_set`` (default: the job)."""
    return basics.rank() in _ps.members(process_set)


def process_set_by_id(process_set_id: int):
    """The registered ProcessSet with this id (0: the global set), for
    Horovod's ``*_op(process_set_id)`` queries."""
    ps = _ps._registered.get(int(process_set_id))
    if ps is None:
        raise ValueError(f"no process set with id {process_set_id} is registered")
    return ps


# ------------------------------------------------------------ Horovod's basics

def init(comm=None, process_sets=None) -> None:
    """Starts commlib on every rank (collective). ``comm``: an optional mpi4py
    communicator. ``process_sets``: ProcessSet objects registered right away,
    in this order, on every rank (Horovod's static sets), or ``"dynamic"``
    (accepted; sets can always be added later with add_process_set)."""
    basics.init(comm, process_sets)


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


"""Process sets: collectives over a subset of the ranks, as in Horovod.

    even = commlib.add_process_set([0, 2])      # every rank calls it, in the same order
    if even.included():
        commlib.allreduce(x, process_set=even)  # only ranks 0 and 2 call it
    commlib.remove_process_set(even)            # every rank again

or, with static sets, ``commlib.init(process_sets=[ProcessSet([0, 2]), ProcessSet([1, 3])])``.
Every collective takes ``process_set=`` (default: the global set, every rank).
Within a set, Average divides by the set's size, allgather/alltoall order rows
by the set's ranks, alltoall splits have one entry per member, and
broadcast's ``root_rank`` is a job rank that must belong to the set. Sets run
concurrently: ranks of disjoint sets never wait for each other.

Adding and removing sets is negotiated like a collective over the whole job:
ranks that pass different lists raise CollectiveMismatchError, and the same
ranks twice, a rank outside the job or removing a set while a collective is
pending on it raise ValueError, on every rank alike.
"""
from __future__ import annotations

import collections
import itertools
from typing import Iterable

from . import runtime
from ._lib import MPI, check, ffi, lib
from .checks import integer
from .handle import Handle, synchronize


def _check_ranks(ranks: Iterable[int]) -> list[int]:
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise TypeError(f"a ProcessSet takes a list of ranks or an mpi4py communicator, got "
                        f"{type(ranks).__name__}")
    out = sorted(integer(r, "a process set's rank") for r in ranks)
    if len(set(out)) != len(out):
        raise ValueError(f"process set ranks must be distinct, got {list(ranks)}")
    return out


class ProcessSet:
    """A set of ranks that can run collectives among themselves.

    ``ProcessSet(ranks)`` or ``ProcessSet(mpi4py_communicator)`` describes
    the set; it becomes usable once registered by ``add_process_set`` (or
    ``init(process_sets=[...])``), which gives it its ``process_set_id``.
    """

    def __init__(self, ranks_or_comm):
        self.process_set_id: int | None = None
        self.mpi_comm = None
        if isinstance(ranks_or_comm, MPI.Comm):
            self.mpi_comm = ranks_or_comm
            self.ranks = None  # resolved when registered (needs the job's ranks)
        else:
            self.ranks = _check_ranks(ranks_or_comm)

    def _resolve_ranks(self) -> list[int]:
        if self.ranks is None:
            # The job ranks of the communicator's members (in the job's
            # communicator: init(comm) may have been given one), known to all.
            job = runtime.job_comm()
            mine = self.mpi_comm.Get_group() if self.mpi_comm != MPI.COMM_NULL else MPI.GROUP_EMPTY
            local = MPI.Group.Translate_ranks(mine, list(range(mine.Get_size())), job.Get_group())
            if MPI.UNDEFINED in local:
                raise ValueError("the communicator of a ProcessSet must contain only ranks of the job")
            gathered = job.allgather(sorted(local))
            self.ranks = sorted({r for part in gathered for r in part})
        return self.ranks

    def included(self) -> bool:
        """Whether this rank belongs to the set."""
        return runtime.rank() in self._members()

    def size(self) -> int:
        return len(self._members())

    def rank(self) -> int | None:
        """This rank's position in the set, None when it is not a member."""
        members = self._members()
        me = runtime.rank()
        return members.index(me) if me in members else None

    def _members(self) -> list[int]:
        if self.ranks is None:
            raise ValueError("this ProcessSet has not been registered (add_process_set)")
        return self.ranks

    def __eq__(self, other) -> bool:
        return (isinstance(other, ProcessSet) and self.process_set_id == other.process_set_id
                and self.ranks == other.ranks)

    def __hash__(self) -> int:  # the ranks only: the id changes when (de)registered
        return hash(tuple(self.ranks or ()))

    def __repr__(self) -> str:
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job (id 0); always registered."""

    def __init__(self):  # pylint: disable=super-init-not-called
        self.process_set_id = 0
        self.mpi_comm = None

    def _members(self) -> list[int]:
        return list(range(runtime.size()))

    @property
    def ranks(self) -> list[int]:
        return list(range(runtime.size())) if runtime.is_initialized() else []

    def included(self) -> bool:
        return True

    def size(self) -> int:
        return runtime.size()

    def rank(self) -> int:
        return runtime.rank()


global_process_set = _GlobalProcessSet()

# Registered sets by id (the global set included).
_registered: dict[int, ProcessSet] = {0: global_process_set}


def is_registered(process_set: ProcessSet) -> bool:
    """Whether this very object is the registered set of its id."""
    psid = process_set.process_set_id
    return psid is not None and _registered.get(psid) is process_set


def add_process_set(process_set) -> ProcessSet:
    """Registers a process set (a ProcessSet, or a list of ranks) and returns
    it with its id. Collective: every rank of the job calls it, in the same
    order, with the same ranks."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if is_registered(ps):
        raise ValueError(f"{ps} is already registered")
    runtime.require_init()
    ranks = ps._resolve_ranks()
    n = runtime.size()
    if not ranks or ranks[0] < 0 or ranks[-1] >= n:
        raise ValueError(f"process set ranks {ranks} must be ranks of the job (0..{n - 1})")
    hid = ffi.new("int64_t*")
    check(lib.commlib_add_process_set(ffi.new("int32_t[]", ranks), len(ranks), hid))
    ps.process_set_id = synchronize(Handle(hid[0], _handle_value, None, "add_process_set"))
    _registered[ps.process_set_id] = ps
    return ps


def _handle_value(hid: int) -> int:
    value = ffi.new("int64_t*")
    check(lib.commlib_handle_value(hid, value))
    return int(value[0])


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a registered process set. Collective over every rank of the
    job. Returns True once it is removed (False if it was not registered)."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"expected a ProcessSet, got {type(process_set).__name__}")
    runtime.require_init()
    psid = process_set.process_set_id
    if psid == 0:
        raise ValueError("the global process set cannot be removed")
    if not is_registered(process_set):
        return False
    hid = ffi.new("int64_t*")
    check(lib.commlib_remove_process_set(psid, hid))
    synchronize(Handle(hid[0], None, None, "remove_process_set"))
    del _registered[psid]
    process_set.process_set_id = None
    return True


def process_set_id(process_set) -> int:
    """The core id of ``process_set`` (None: the global set), checked to be
    registered and to include this rank, before anything is sent."""
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a commlib ProcessSet, got {type(process_set).__name__}")
    psid = process_set.process_set_id
    if not is_registered(process_set):
        raise ValueError(f"{process_set} is not registered; call add_process_set() first")
    if psid and runtime.rank() not in process_set.ranks:
        raise ValueError(f"rank {runtime.rank()} is not a member of {process_set}; only its members "
                         "may call collectives on it")
    return psid


def members(process_set) -> list[int]:
    """The job ranks of a process set (None: every rank)."""
    return (process_set or global_process_set)._members()


def reset_process_sets() -> None:
    """Forgets every registered set but the global one (at shutdown)."""
    for psid, ps in list(_registered.items()):
        if psid:
            ps.process_set_id = None
            del _registered[psid]


# ------------------------------------------------ checks and queries for frontends

def process_set_by_id(process_set_id: int) -> ProcessSet:
    """The registered ProcessSet with this id (0: the global set), for
    Horovod's ``*_op(process_set_id)`` queries."""
    ps = _registered.get(int(process_set_id))
    if ps is None:
        raise ValueError(f"no process set with id {process_set_id} is registered")
    return ps


def check_process_set(process_set, member: bool = True) -> ProcessSet:
    """``process_set`` checked before anything is traced or sent, and returned
    (None: the global set). TypeError for anything but a ProcessSet,
    ValueError for a set that is not registered (add_process_set) and, when
    ``member``, for a set this rank does not belong to: only members may call
    collectives on a set. ``member=False`` is for objects every rank builds
    with the set (Horovod's DistributedOptimizer/DistributedGradientTape), which
    only reduce on members."""
    if process_set is None or process_set is global_process_set:  # (always registered, every rank in it)
        return global_process_set
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a ProcessSet (commlib.ProcessSet, "
                        f"global_process_set), got {type(process_set).__name__}")
    if not is_registered(process_set):
        raise ValueError(f"{process_set} is not registered; call add_process_set() (or "
                         "init(process_sets=[...])) on every rank first")
    if member:
        process_set_id(process_set)  # ValueError for a non-member
    return process_set


def set_size(process_set=None) -> int:
    """The number of ranks of ``process_set`` (default: the job)."""
    return len(members(process_set))


def set_rank(process_set=None) -> int:
    """This rank's position in ``process_set`` (its rank in the job for the
    global set); ValueError when it is not a member."""
    ranks = members(process_set)
    me = runtime.rank()
    if me not in ranks:
        raise ValueError(f"rank {me} is not a member of {process_set}")
    return ranks.index(me)


def included(process_set=None) -> bool:
    """Whether this rank belongs to ``process_set`` (default: the job)."""
    return runtime.rank() in members(process_set)


def communicates(process_set=None) -> bool:
    """Whether this rank exchanges with others in ``process_set``: it is a
    member of a set of more than one rank."""
    return included(process_set) and set_size(process_set) > 1


_instances: collections.defaultdict = collections.defaultdict(itertools.count)


def instance_name(prefix: str, process_set) -> str:
    """``prefix<i>`` for the i-th object named ``prefix`` built with
    ``process_set`` in this process: the same name on every rank that builds
    them in the same order (what its collectives are named after)."""
    return f"{prefix}{next(_instances[prefix, process_set.process_set_id])}"

"""The state of the running job that every layer shares: whether commlib is
initialised, this rank and the job's size, the job's mpi4py communicator,
and the one counter behind generated collective names.

It sits below basics (init/shutdown), process_sets, ops and p2p, which all
read it; only basics changes it (``set_job_comm``, ``reset_names``).
"""
from __future__ import annotations

import collections
import itertools
import weakref

from ._lib import lib
from .errors import NotInitializedError

_job_comm = None  # the mpi4py communicator of the job's ranks (set by init)

# Per-kind and per-process-set counters for unnamed requests: ranks that make
# the same calls on a set in the same order generate the same names, and
# calls on one set do not advance another set's counters.
_name_counters: collections.defaultdict = collections.defaultdict(itertools.count)
# Joins completed: a joined rank skips the others' calls, so the counters
# differ between ranks after a join; every rank starts them again, with the
# epoch in the names (the old names may still be in flight nowhere).
_name_epoch = 0
# The names of objects that make the same calls again and again (a layer's,
# see owned_name): kept until the counters start again.
_owned_names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def is_initialized() -> bool:
    """Whether commlib.init() has run (and shutdown() has not)."""
    return bool(lib.commlib_is_initialized())


def require_init() -> None:
    """NotInitializedError unless commlib is initialised."""
    if not lib.commlib_is_initialized():
        raise NotInitializedError("commlib is not initialized: call commlib.init() first")


def rank() -> int:
    """This process's rank in the job."""
    require_init()
    return lib.commlib_rank()


def size() -> int:
    """The number of ranks in the job."""
    require_init()
    return lib.commlib_size()


def job_comm():
    """The mpi4py communicator of the job's ranks: MPI.COMM_WORLD, or the
    communicator given to init(); None before init."""
    return _job_comm


def set_job_comm(comm) -> None:
    global _job_comm
    _job_comm = comm


# Names generated so far (any kind or set) and the last one: a call refused
# on this rank reads whether it generated its name yet (commlib.refusals).
generated = 0
last_generated = ""


def auto_name(kind: str, name: str | None = None, psid: int = 0) -> str:
    """``name`` (checked: a non-empty string), or the next
    ``<kind>.noname.<n>`` of process set ``psid`` when it is None."""
    if name is None:
        global generated, last_generated
        n = next(_name_counters[kind, psid])
        generated += 1
        last_generated = f"{kind}.noname.{n}" if not _name_epoch else f"{kind}.noname.j{_name_epoch}.{n}"
        return last_generated
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if "\x00" in name:  # the core takes C strings: it would end the name there
        raise ValueError(f"name must not contain a NUL character, got {name!r}")
    return name


def owned_name(owner, kind: str, psid: int = 0) -> str:
    """``owner``'s name for its calls of ``kind`` on process set ``psid``:
    generated (as for an unnamed call, from that set's counter) the first
    time it asks, then the same until the counters start again (init,
    shutdown, a join). Kept beside the owner, not on it: a copy of it
    (deepcopy, pickle) draws its own."""
    try:
        names = _owned_names.get(owner)
    except TypeError:  # (not weakly referenceable: an int, a str, a tuple...)
        raise TypeError(f"owned_name: the owner must be an object that can be weakly "
                        f"referenced (a layer, a module), got {type(owner).__name__}") from None
    if names is None:
        names = _owned_names[owner] = {}
    name = names.get((kind, psid))
    if name is None:
        name = names[kind, psid] = auto_name(kind, None, psid)
    return name


def reset_names() -> None:
    """Restarts every generated-name counter (at init and shutdown), so that
    a job initialised again generates the same names on every rank."""
    global _name_epoch
    _name_counters.clear()
    _owned_names.clear()
    _name_epoch = 0


def name_epoch() -> int:
    """Joins completed since init (see names_after_join)."""
    return _name_epoch


def names_after_join() -> int:
    """Every rank's join() returned: generated names start again, the same
    on every rank, in a new epoch (returned; the join's own name is its)."""
    global _name_epoch
    _name_counters.clear()
    _owned_names.clear()
    _name_epoch += 1
    return _name_epoch

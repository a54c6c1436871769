"""Initialisation and topology: init, shutdown, rank, size, local/cross ranks."""
from __future__ import annotations

import atexit

from ._lib import MPI, check, lib
from .errors import NotInitializedError

_atexit_registered = False
_job_comm = None  # the mpi4py communicator of the job's ranks (set by init)


def init(comm=None, process_sets=None) -> None:
    """Starts commlib on every rank of MPI_COMM_WORLD, or of ``comm`` (an
    mpi4py communicator) when given. Collective: every rank must call it.
    Calling it again while initialised does nothing.

    ``process_sets``: ProcessSet objects to register now, in this order
    (Horovod's static sets), or ``"dynamic"`` (accepted for Horovod
    compatibility: sets can always be added later)."""
    global _atexit_registered, _job_comm
    if process_sets is not None and process_sets != "dynamic":
        from .process_sets import ProcessSet
        if not all(isinstance(p, ProcessSet) for p in process_sets):
            raise TypeError("process_sets must be a list of commlib ProcessSet objects or 'dynamic'")
    if comm is None:
        check(lib.commlib_init(0, 0))
    else:
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
        if comm == MPI.COMM_NULL:
            raise ValueError("comm is MPI.COMM_NULL: this rank is not part of the communicator")
        check(lib.commlib_init(MPI._handleof(comm), 1))
    _job_comm = comm if comm is not None else MPI.COMM_WORLD
    if not _atexit_registered:
        # Before mpi4py's own MPI_Finalize, which runs after atexit handlers.
        atexit.register(shutdown)
        _atexit_registered = True
    if process_sets is not None and process_sets != "dynamic":
        from .process_sets import add_process_set
        for ps in process_sets:
            add_process_set(ps)


def shutdown() -> None:
    """Stops the background thread. Collectives still pending fail with
    NotInitializedError; other ranks' collectives that wait for this rank fail
    too instead of hanging."""
    check(lib.commlib_shutdown())
    from .process_sets import _reset
    _reset()
    if lib.commlib_broken():
        # A peer is gone: MPI_Finalize would wait for it forever. Make mpi4py
        # abort at exit instead, which ends the job (the error was reported).
        set_abort = getattr(MPI, "_set_abort_status", None)
        if set_abort is not None:
            set_abort(1)


def is_initialized() -> bool:
    return bool(lib.commlib_is_initialized())


def _require_init() -> None:
    if not lib.commlib_is_initialized():
        raise NotInitializedError("commlib is not initialized: call commlib.init() first")


def rank() -> int:
    """This process's rank in the job."""
    _require_init()
    return lib.commlib_rank()


def size() -> int:
    """The number of ranks in the job."""
    _require_init()
    return lib.commlib_size()


def local_rank() -> int:
    """This process's rank among the ranks of its host."""
    _require_init()
    return lib.commlib_local_rank()


def local_size() -> int:
    """The number of ranks on this host."""
    _require_init()
    return lib.commlib_local_size()


def cross_rank() -> int:
    """The index of this host among the hosts (ranks with this local rank)."""
    _require_init()
    return lib.commlib_cross_rank()


def cross_size() -> int:
    """The number of hosts (ranks that share this local rank)."""
    _require_init()
    return lib.commlib_cross_size()


def mpi_threads_supported() -> bool:
    """Whether MPI runs with MPI_THREAD_MULTIPLE (Horovod compatibility)."""
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_library_version() -> str:
    from ._lib import ffi

    return ffi.string(lib.commlib_mpi_library_version()).decode("utf-8", "replace").strip()


def response_cache_stats() -> dict:
    """This rank's response cache counters since init: ``hits`` (requests that
    skipped the coordinator), ``misses`` (negotiated by rank 0), ``invalidations``
    (a cached request submitted with another description), ``cached_runs``
    (requests executed through the cache). All zero when the cache is off
    (``COMMLIB_CACHE_CAPACITY=0``, several hosts, or a single rank)."""
    from ._lib import ffi

    _require_init()
    out = ffi.new("int64_t[4]")
    lib.commlib_cache_stats(out)
    return {"hits": out[0], "misses": out[1], "invalidations": out[2], "cached_runs": out[3]}

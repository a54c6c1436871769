"""Initialisation and topology: init, shutdown, rank, size, local/cross ranks."""
from __future__ import annotations

import atexit
import os
import warnings

from . import config, failure_notes, horovod_env, runtime, stack_dumps
from ._lib import MPI, check, ffi, lib
from .launch import job_cleanup
from .launch._rankwrap import STATUS_DIR_ENV
from .process_sets import ProcessSet, add_process_set, reset_process_sets
from .runtime import is_initialized, rank, require_init, size  # noqa: F401 - commlib.rank, ...

_atexit_registered = False


def init(comm=None, process_sets=None) -> None:
    """Starts commlib on every rank of MPI_COMM_WORLD, or of ``comm`` (an
    mpi4py communicator) when given. Collective: every rank must call it.
    Calling it again while initialised does nothing.

    ``process_sets``: ProcessSet objects to register now, in this order
    (Horovod's static sets), or ``"dynamic"`` (accepted for Horovod
    compatibility: sets can always be added later)."""
    global _atexit_registered
    if process_sets is not None and process_sets != "dynamic":
        if not all(isinstance(p, ProcessSet) for p in process_sets):
            raise TypeError("process_sets must be a list of commlib ProcessSet objects or 'dynamic'")
    stack_dumps.install(_engine_line)  # (before the core starts: a hang in init() shows too)
    horovod_env.apply()  # (HOROVOD_FUSION_THRESHOLD... read as COMMLIB_*)
    if not runtime.is_initialized():
        runtime.reset_names()  # a new job: names count from 0 on every rank
    if comm is not None:
        if not isinstance(comm, MPI.Comm):
            raise TypeError(f"comm must be an mpi4py communicator, got {type(comm).__name__}")
        if comm == MPI.COMM_NULL:
            raise ValueError("comm is MPI.COMM_NULL: this rank is not part of the communicator")
    try:
        check(lib.commlib_init(0, 0) if comm is None else lib.commlib_init(MPI._handleof(comm), 1))
    except ValueError as e:  # (a bad variable's value, maybe a Horovod one's)
        message = horovod_env.explain(str(e))
        if message == str(e):
            raise
        raise type(e)(message) from None
    runtime.set_job_comm(comm if comm is not None else MPI.COMM_WORLD)
    failure_notes.install(lib.commlib_rank())
    _report_segments()
    if lib.commlib_rank() == 0:  # (once per job: the settings are the launcher's, alike on every rank)
        for name, like in config.misspelt().items():
            warnings.warn(f"{name} is set, but commlib reads no such variable (did you mean {like}?)",
                          stacklevel=2)
    if not _atexit_registered:
        # Before mpi4py's own MPI_Finalize, which runs after atexit handlers.
        atexit.register(shutdown)
        _atexit_registered = True
    if process_sets is not None and process_sets != "dynamic":
        for ps in process_sets:
            add_process_set(ps)


def _report_segments() -> None:
    """Under commlibrun: this rank's /dev/shm segments (its MPI's, now that
    init is done) told to the launcher, which removes whatever of them a
    failed job leaves (commlib.launch.job_cleanup)."""
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if status_dir and os.path.isdir(status_dir):
        try:
            job_cleanup.report_segments(status_dir)
        except OSError:  # (the cleanup falls back on its scans)
            pass


def shutdown() -> None:
    """Stops the background thread. Collectives still pending fail with
    NotInitializedError; other ranks' collectives that wait for this rank fail
    too instead of hanging."""
    check(lib.commlib_shutdown())
    reset_process_sets()
    runtime.reset_names()
    if lib.commlib_broken():
        # A peer is gone: MPI_Finalize would wait for it forever. Make mpi4py
        # abort at exit instead, which ends the job (the error was reported).
        set_abort = getattr(MPI, "_set_abort_status", None)
        if set_abort is not None:
            failure_notes.note_abort()
            set_abort(1)


def local_rank() -> int:
    """This process's rank among the ranks of its host."""
    require_init()
    return lib.commlib_local_rank()


def local_size() -> int:
    """The number of ranks on this host."""
    require_init()
    return lib.commlib_local_size()


def cross_rank() -> int:
    """The index of this host among the hosts (ranks with this local rank)."""
    require_init()
    return lib.commlib_cross_rank()


def cross_size() -> int:
    """The number of hosts (ranks that share this local rank)."""
    require_init()
    return lib.commlib_cross_size()


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return size() == local_size() * cross_size()


def mpi_threads_supported() -> bool:
    """Whether MPI runs with MPI_THREAD_MULTIPLE (Horovod compatibility)."""
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_library_version() -> str:
    return ffi.string(lib.commlib_mpi_library_version()).decode("utf-8", "replace").strip()


def response_cache_stats() -> dict:
    """This rank's response cache counters since init: ``hits`` (requests that
    skipped the coordinator), ``misses`` (negotiated by rank 0), ``invalidations``
    (a cached request submitted with another description), ``cached_runs``
    (requests executed through the cache). All zero when the cache is off
    (``COMMLIB_CACHE_CAPACITY=0``, several hosts, or a single rank)."""
    require_init()
    out = ffi.new("int64_t[4]")
    lib.commlib_cache_stats(out)
    return {"hits": out[0], "misses": out[1], "invalidations": out[2], "cached_runs": out[3]}


def engine_state() -> str:
    """One line on where this rank's engine is: its open, held and launched
    requests, and, when one pass of it has run for long, the steps it is in
    (``creating an NCCL communicator``, ``ncclCommInitRank``, a collective's
    name). It answers while the engine is stuck; ``commlibrun --timeout``
    prints it for every rank before it stops a job that hangs."""
    return ffi.string(lib.commlib_engine_state()).decode("utf-8", "replace")


def _engine_line() -> str:
    who = f"rank {lib.commlib_rank()}" if lib.commlib_is_initialized() else f"pid {os.getpid()}"
    return f"commlib ({who}): engine: {engine_state()}"


def autotune_history() -> list:
    """The settings applied on this rank since init, in order: one dict per
    change with ``collectives`` (how many collectives this rank ran before it:
    every rank applies a change after the same ones), ``fusion_threshold``
    (bytes), ``cycle_time_ms``, ``tree_max_bytes`` and ``final`` (autotune's
    chosen setting, after which nothing changes). Autotune (``COMMLIB_AUTOTUNE=1``)
    adds one per setting it tries."""
    require_init()
    n = lib.commlib_tune_history(ffi.NULL, 0)
    out = ffi.new("int64_t[]", 5 * max(n, 1))
    n = min(n, lib.commlib_tune_history(out, n))
    return [{"collectives": out[5 * i], "fusion_threshold": out[5 * i + 1],
             "cycle_time_ms": out[5 * i + 2] / 1000.0, "tree_max_bytes": out[5 * i + 3],
             "final": out[5 * i + 4] == 2} for i in range(n)]

"""Access to the compiled core (commlib._core) and the mapping of its status
codes to Python exceptions.

Only the binding modules below import this module: they alone touch cffi
(``ffi``, ``lib``), each wrapping one part of the core's C API in Python
types; every other module of commlib, and the frontends, call their public
functions (tests/unit/test_import_graph.py checks the list).
Binding modules: basics, config, device_ops, device_p2p, dtypes, gpu,
grouped_ops, handle, ops, p2p, pieces_ops, process_sets, runtime, submit,
timeline.
"""
from __future__ import annotations

# mpi4py first: it initialises MPI (MPI_THREAD_MULTIPLE) and loads the MPI
# library, so that the core binds to that same library (same soname) instead
# of a second MPI in one process.
from mpi4py import MPI  # noqa: F401

from . import errors

try:
    from ._core import ffi, lib
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "commlib's compiled core (commlib._core) is missing or cannot load its MPI library: "
        f"{exc}. Reinstall with `pip install .` (it needs mpicxx; see README)."
    ) from exc

_EXCEPTIONS = {
    lib.COMMLIB_ERR_VALUE: ValueError,
    lib.COMMLIB_ERR_TYPE: TypeError,
    lib.COMMLIB_ERR_MISMATCH: errors.CollectiveMismatchError,
    lib.COMMLIB_ERR_NOT_INIT: errors.NotInitializedError,
    lib.COMMLIB_ERR_PEER_LOST: errors.RankLostError,
    lib.COMMLIB_ERR_INTERNAL: errors.CommlibError,
    lib.COMMLIB_ERR_TIMEOUT: TimeoutError,
    lib.COMMLIB_ERR_TIMED_OUT: errors.CollectiveTimeoutError,
}


def last_error() -> str:
    return ffi.string(lib.commlib_last_error()).decode("utf-8", "replace")


def error_for(code: int, message: str | None = None) -> Exception:
    cls = _EXCEPTIONS.get(code, errors.CommlibError)
    if cls is errors.RankLostError:
        from . import failure_notes

        failure_notes.note_rank_lost()
    exc = cls(message if message is not None else last_error())
    exc.commlib_others_told = True  # (the core's own error: see commlib.refusals)
    return exc


def check(code: int) -> None:
    """Raises the exception for a non-zero status code of a core call."""
    if code != lib.COMMLIB_OK:
        raise error_for(code)

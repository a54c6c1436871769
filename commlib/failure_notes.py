"""Which rank's failure the others followed, for ``commlibrun``'s report.

When one rank fails, the others usually fail right after it *because* of
it: its exit shuts commlib down there (``NotInitializedError`` naming it
elsewhere), or it dies (``RankLostError``), or it never answers
(``CollectiveTimeoutError``). Exit times cannot tell them apart: the rank
that failed first may take longer to exit. So each rank started by
``commlibrun`` notes, at the moment an exception escapes its script (before
the exit's ``shutdown()`` tells the others), whether that exception was a
consequence of another rank's failure, and, as soon as it meets one, that
it met a RankLostError (caught or not); ``commlibrun`` names a failed rank
without such a note first.
"""
from __future__ import annotations

import os
import re
import sys

from .launch._rankwrap import STATUS_DIR_ENV  # (set by commlibrun for each rank's wrapper)

_installed = False
_rank = None


def _is_consequence(exc: BaseException) -> bool:
    from .errors import CollectiveTimeoutError, NotInitializedError, RankLostError

    seen = set()
    while exc is not None and id(exc) not in seen:  # frameworks may wrap commlib's errors
        if isinstance(exc, (NotInitializedError, RankLostError, CollectiveTimeoutError)):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _write(status_dir: str, name: str, text: str) -> None:
    path = os.path.join(status_dir, name)
    try:
        with open(f"{path}.tmp{os.getpid()}", "w") as f:
            f.write(text)
        os.replace(f"{path}.tmp{os.getpid()}", path)
    except OSError:
        pass  # (a rank on another host: the launcher's directory is not there)


def _note(status_dir: str, rank: int, exc: BaseException) -> None:
    _write(status_dir, f"rank{rank}.failure", f"{int(_is_consequence(exc))} {type(exc).__name__}\n")


def _flag(suffix: str) -> None:
    """Under ``commlibrun``, once this rank is known: writes ``rank<R><suffix>``."""
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if status_dir and _rank is not None:
        _write(status_dir, f"rank{_rank}{suffix}", "1\n")


def note_abort() -> None:
    """Under ``commlibrun``: this rank is about to abort MPI at exit (it lost
    contact with peers). The abort tears the job down, the ranks' wrappers
    with it, before they record how their rank ended; this note lets
    ``commlibrun`` name the rank anyway."""
    _flag(".abort")


def note_rank_lost() -> None:
    """Under ``commlibrun``: this rank met a RankLostError (another rank
    died). Noted when the error is made, not only when it escapes: a script
    that catches it and exits with a code of its own has failed because of
    the dead rank too, and the dead rank's own exit may be recorded later on
    a loaded machine."""
    _flag(".lost")


def install(rank: int) -> None:
    """Under ``commlibrun``: note an uncaught exception's kind before the
    previous ``sys.excepthook`` runs. Once per process."""
    global _installed, _rank
    _rank = rank
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if _installed or not status_dir:
        return
    _installed = True
    previous = sys.excepthook

    def hook(kind, value, tb):
        _note(status_dir, rank, value)
        previous(kind, value, tb)

    sys.excepthook = hook


def rank_files(status_dir: str, suffix: str = ""):
    """``(rank, text)`` of every ``rank<R><suffix>`` file in ``status_dir``
    (the wrappers' status files, or these notes); unreadable ones are skipped."""
    try:
        names = os.listdir(status_dir)
    except OSError:
        return
    for name in names:
        m = re.fullmatch(r"rank(\d+)" + re.escape(suffix), name)
        if not m:
            continue
        try:
            with open(os.path.join(status_dir, name)) as f:
                yield int(m.group(1)), f.read()
        except OSError:
            continue


def consequences(status_dir: str) -> set[int]:
    """The ranks whose noted failure followed another rank's, and those that
    met a RankLostError (note_rank_lost)."""
    noted = {rank for rank, text in rank_files(status_dir, ".failure") if text.split()[:1] == ["1"]}
    return noted | {rank for rank, _ in rank_files(status_dir, ".lost")}


def aborted(status_dir: str) -> list[int]:
    """The ranks that noted an abort of MPI (note_abort), in order."""
    return sorted(rank for rank, _ in rank_files(status_dir, ".abort"))

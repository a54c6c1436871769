"""Where each rank is, for a job that outlived ``commlibrun --timeout``.

Under ``commlibrun`` (``COMMLIB_RUN_STATUS_DIR`` set), ``commlib.init()``
has ``SIGUSR2`` write the Python stack of every thread to stderr
(``faulthandler``; it works while the process is stuck in C code too) and
then, once the main thread runs Python again (a wait for a handle does,
every ``WAIT_SLICE_S``), one line on where the rank's engine is
(``commlib.engine_state()``: what it holds and launched, and the step a
stuck pass of it is in, such as ``ncclCommInitRank``), unless the program
handles ``SIGUSR2`` itself; it says so with a file
``stacks.<pid>`` in that folder. When a job outlives its ``--timeout``,
``commlibrun`` sends ``SIGUSR2`` to the processes of the job on its host that
said so, waits ``STACK_DUMP_SECONDS`` for their stacks to reach
its output, and only then stops the job: a hang says where it hangs.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import sys
from typing import Callable

from .launch._rankwrap import STACKS_FILE_PREFIX, STACKS_SIGNAL, STATUS_DIR_ENV

_installed = False
_describe: Callable[[], str] = str


def install(describe: Callable[[], str]) -> bool:
    """Registers the stack dump on SIGUSR2 (once, under commlibrun, when
    SIGUSR2 has no handler), with ``describe()`` for the line that follows
    it (the rank's engine state); whether it is registered."""
    global _installed, _describe
    if _installed:
        return True
    _describe = describe
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if not status_dir or not os.path.isdir(status_dir):
        return False
    try:
        if signal.getsignal(STACKS_SIGNAL) not in (signal.SIG_DFL, None):
            return False  # (the program's own handler stays)
        try:  # (a Python handler only from the main thread; the stacks come either way)
            signal.signal(STACKS_SIGNAL, _print_engine_state)
            chained = True
        except ValueError:
            chained = False  # (chaining to SIG_DFL would end the process)
        faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True, chain=chained)
    except (AttributeError, OSError, ValueError, RuntimeError):  # no usable stderr file descriptor
        _reset()
        return False
    try:
        open(os.path.join(status_dir, f"{STACKS_FILE_PREFIX}{os.getpid()}"), "w").close()
    except OSError:
        faulthandler.unregister(STACKS_SIGNAL)
        _reset()
        return False
    _installed = True
    return True


def _reset() -> None:
    try:
        if signal.getsignal(STACKS_SIGNAL) is _print_engine_state:
            signal.signal(STACKS_SIGNAL, signal.SIG_DFL)
    except ValueError:  # (not the main thread: it was never set from here)
        pass


def _print_engine_state(signum, frame) -> None:  # noqa: ARG001 - a signal handler's signature
    try:
        line = _describe()
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not raise in the program
        line = f"commlib (pid {os.getpid()}): engine state unavailable ({exc})"
    print(line, file=sys.stderr, flush=True)

"""Where each rank is, for a job that outlived ``commlibrun --timeout``.

Under ``commlibrun`` (``COMMLIB_RUN_STATUS_DIR`` set), ``commlib.init()``
has ``SIGUSR2`` write the Python stack of every thread to stderr
(``faulthandler``; it works while the process is stuck in C code too),
unless the program handles ``SIGUSR2`` itself, and says so with a file
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

from .launch._rankwrap import STACKS_FILE_PREFIX, STACKS_SIGNAL, STATUS_DIR_ENV

_installed = False


def install() -> bool:
    """Registers the stack dump on SIGUSR2 (once, under commlibrun, when
    SIGUSR2 has no handler); whether it is registered."""
    global _installed
    if _installed:
        return True
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if not status_dir or not os.path.isdir(status_dir):
        return False
    try:
        if signal.getsignal(STACKS_SIGNAL) not in (signal.SIG_DFL, None):
            return False  # (the program's own handler stays)
        faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
    except (AttributeError, OSError, ValueError, RuntimeError):  # no usable stderr file descriptor
        return False
    try:
        open(os.path.join(status_dir, f"{STACKS_FILE_PREFIX}{os.getpid()}"), "w").close()
    except OSError:
        faulthandler.unregister(STACKS_SIGNAL)
        return False
    _installed = True
    return True

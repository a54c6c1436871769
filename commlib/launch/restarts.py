"""``commlibrun --restarts N``: start a failed job again, up to N times.

An MPI job cannot re-form after one of its ranks died, so recovery is a new
job: the launcher runs the whole command again, and training scripts resume
from their last commit (:mod:`commlib.elastic`). Each restart is printed with
its cause (the rank that failed first and how); one count covers the job.

Standard library only, like the launcher.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, NamedTuple

# Set in every rank's environment: 0 on the first attempt, then 1, 2, ...
RESTART_ENV = "COMMLIB_RESTART"
# Where elastic scripts write their commits (read by commlib.elastic).
ELASTIC_DIR_ENV = "COMMLIB_ELASTIC_DIR"


class Attempt(NamedTuple):
    """How one run of the job ended."""
    code: int                # the launcher's exit code for it (0: success)
    cause: str | None = None  # e.g. "rank 1 was killed by signal SIGKILL (first failure)"
    retryable: bool = True   # False after --timeout or a signal to the launcher


def run_with_restarts(attempt: Callable[[int, float | None], Attempt], restarts: int,
                      timeout: float | None = None, out=None, clock=time.monotonic) -> int:
    """Call ``attempt(number, seconds_left)`` until it succeeds, fails in a
    way a restart cannot help, or ``restarts`` restarts are used up; return
    the last exit code. ``timeout`` bounds all attempts together."""
    out = sys.stderr if out is None else out
    start = clock()
    number = 0
    while True:
        left = None if timeout is None else max(0.0, timeout - (clock() - start))
        began = clock()
        result = attempt(number, left)
        failed = result.code != 0
        if failed and result.cause:
            print(f"commlibrun: job failed: {result.cause}", file=out, flush=True)
        if not failed or not result.retryable or number >= restarts:
            break
        number += 1
        print(f"commlibrun: restart {number} of {restarts} after {result.cause or 'a failure'} "
              f"(that attempt ran {clock() - began:.1f} s)", file=out, flush=True)
    if failed and restarts and result.retryable:
        print(f"commlibrun: giving up: the job failed {number + 1} times "
              f"({restarts} restart{'s' if restarts != 1 else ''} allowed); "
              f"last cause: {result.cause or 'unknown'}", file=out, flush=True)
    return result.code

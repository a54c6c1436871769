"""Horovod's environment variables, read as commlib's.

A job written for Horovod often carries its tuning in the environment
(``HOROVOD_FUSION_THRESHOLD=33554432 HOROVOD_CYCLE_TIME=2 ...``). ``init()``
reads these as the ``COMMLIB_*`` variables they correspond to (same units)
whenever the ``COMMLIB_*`` one is not set itself, and ``commlibrun``
forwards ``HOROVOD_*`` variables to every rank as it does ``COMMLIB_*``
ones. A bad value fails ``init()`` under the ``COMMLIB_*`` name it was read
as, with the Horovod variable it came from. Horovod variables without a
counterpart here (controller, CPU/GPU operations, hierarchical switches:
commlib picks those itself) are ignored.
"""
from __future__ import annotations

import os
from typing import Mapping, MutableMapping

# Horovod's variable: commlib's (same meaning and units).
ALIASES = {
    "HOROVOD_FUSION_THRESHOLD": "COMMLIB_FUSION_THRESHOLD",
    "HOROVOD_CYCLE_TIME": "COMMLIB_CYCLE_TIME",
    "HOROVOD_CACHE_CAPACITY": "COMMLIB_CACHE_CAPACITY",
    "HOROVOD_TIMELINE": "COMMLIB_TIMELINE",
    "HOROVOD_TIMELINE_MARK_CYCLES": "COMMLIB_TIMELINE_MARK_CYCLES",
    "HOROVOD_AUTOTUNE": "COMMLIB_AUTOTUNE",
    "HOROVOD_AUTOTUNE_LOG": "COMMLIB_AUTOTUNE_LOG",
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "COMMLIB_STALL_CHECK_TIME",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "COMMLIB_TIMEOUT",
}
# Seconds of COMMLIB_STALL_CHECK_TIME that stand for "never warn"
# (HOROVOD_STALL_CHECK_DISABLE=1, commlibrun --no-stall-check).
NO_STALL_CHECK = "1000000000"


def _read(environ: Mapping[str, str]) -> dict:
    """``{COMMLIB_* variable: (its value, the Horovod variable it is read
    from)}`` for ``environ``, each only where the ``COMMLIB_*`` variable is
    unset (or empty)."""
    out = {}
    for horovod, name in ALIASES.items():
        value = environ.get(horovod, "")
        # (HOROVOD_TIMELINE=DYNAMIC: Horovod's "started later through the API")
        if value and not environ.get(name) and not (horovod == "HOROVOD_TIMELINE" and value == "DYNAMIC"):
            out[name] = (value, horovod)
    if environ.get("HOROVOD_STALL_CHECK_DISABLE", "") not in ("", "0") and \
            not environ.get("COMMLIB_STALL_CHECK_TIME"):
        out["COMMLIB_STALL_CHECK_TIME"] = (NO_STALL_CHECK, "HOROVOD_STALL_CHECK_DISABLE")
    return out


def commlib_values(environ: Mapping[str, str]) -> dict:
    """The ``COMMLIB_*`` variables that ``environ``'s Horovod variables stand
    for, each only where the ``COMMLIB_*`` variable is unset (or empty)."""
    return {name: value for name, (value, _) in _read(environ).items()}


# COMMLIB_* variable: the Horovod variable whose value apply() set it to.
_read_from: dict[str, str] = {}


def apply(environ: MutableMapping[str, str] | None = None) -> None:
    """Sets ``commlib_values(environ)`` in ``environ`` (default: this
    process's environment, which the core reads at init)."""
    env = os.environ if environ is None else environ
    read = _read(env)
    env.update((name, value) for name, (value, _) in read.items())
    if environ is None:
        _read_from.update((name, horovod) for name, (_, horovod) in read.items())


def explain(message: str) -> str:
    """``message`` (an error of init's about a variable) with the Horovod
    variable that a COMMLIB_* one it names was read from."""
    for name, horovod in _read_from.items():
        if name in message and horovod in os.environ:
            return f"{message} (read from {horovod}={os.environ[horovod]!r})"
    return message

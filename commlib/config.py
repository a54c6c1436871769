"""The core's configuration table: the ``COMMLIB_*`` environment variables
it reads at ``init()``, with their defaults and accepted values.

    import commlib.config
    for entry in commlib.config.table():
        print(entry.name, entry.default, entry.accepted, entry.meaning)
    commlib.config.check("COMMLIB_ALLREDUCE_ALGO", "ring")   # None, or ValueError

The table lives in the compiled core (csrc/base/config.cc); ``init()``
raises the same ``ValueError`` on every rank when a value is bad. None of
these functions needs ``init()``. An empty variable counts as unset.
"""
from __future__ import annotations

import difflib
import os
from typing import Mapping, NamedTuple

from ._lib import check as _check
from ._lib import ffi, lib


class Entry(NamedTuple):
    name: str
    default: str   # as text, e.g. "67108864", "auto"
    accepted: str  # in words, e.g. "integer >= 0", "0 or 1", "auto, ring"
    meaning: str


def _text(ptr) -> str:
    return ffi.string(ptr).decode("utf-8")


def table() -> list[Entry]:
    """Every variable the core reads, in the order of README's table."""
    out = []
    fields = [ffi.new("const char**") for _ in Entry._fields]
    for i in range(lib.commlib_config_count()):
        _check(lib.commlib_config_entry(i, *fields))
        out.append(Entry(*(_text(f[0]) for f in fields)))
    return out


def names() -> list[str]:
    return [e.name for e in table()]


# The variables commlib reads besides the core's table: the launcher's, the
# build's and the Python side's (README's other configuration tables).
OTHER_VARIABLES = frozenset({
    "COMMLIB_BUILD_JOBS", "COMMLIB_ELASTIC_DIR", "COMMLIB_FAILURE_GRACE", "COMMLIB_MPICXX",
    "COMMLIB_MPIEXEC", "COMMLIB_RESTART", "COMMLIB_RUN_BIND_CORES", "COMMLIB_RUN_OUTPUT_SOCKET",
    "COMMLIB_RUN_STATUS_DIR"})


def misspelt(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``COMMLIB_*`` names set in ``environ`` (default: os.environ) that
    commlib does not read but that look like one it does, each with the one
    it resembles: a misspelt setting has no effect at all, and ``init()``
    (rank 0) warns of each. Names unlike any of commlib's are left alone."""
    env = os.environ if environ is None else environ
    known = set(names()) | OTHER_VARIABLES
    prefix = len("COMMLIB_")  # (compared after it: every name shares it)
    by_suffix = {name[prefix:]: name for name in known}
    out = {}
    for name in env:
        if name.startswith("COMMLIB_") and name not in known:
            close = difflib.get_close_matches(name[prefix:], by_suffix, n=1, cutoff=0.8)
            if close:
                out[name] = by_suffix[close[0]]
    return out


def check(name: str, value: str) -> None:
    """Raises ValueError ``"NAME='value': reason"`` when ``init()`` would
    reject ``value`` for ``name`` (or name is not in the table)."""
    _check(lib.commlib_config_check(name.encode("utf-8"), str(value).encode("utf-8")))


def check_environ(environ: Mapping[str, str] | None = None) -> None:
    """Checks every table variable set in ``environ`` (default: os.environ),
    raising ValueError for the first bad one, as ``init()`` would."""
    env = os.environ if environ is None else environ
    for name in names():
        if name in env:
            check(name, env[name])

"""Checks of ``commlibrun``'s rank counts and host lists, made before any MPI
launcher sees them: mpiexec wraps a large ``-np`` around (4294967297 ran one
rank) and dies on a hostfile slot count of 0 (SIGFPE) or hangs on -1.

Standard library only (see commlib.launch.launcher).
"""

import re

from .mpi_discovery import LauncherError

# Most ranks in a job, and most slots on one host.
MAX_RANKS = 65536
MAX_SLOTS = 4096
# Hostfile keys that give a slot count (Open MPI: "host slots=4 max_slots=8").
_SLOT_KEYS = ("slots", "max_slots", "max-slots")

# A host name (RFC 1123 labels), an IPv4 address or a bracketed IPv6 one
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                   r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\])$")


def check_np(np) -> None:
    """LauncherError unless ``np`` is a rank count from 1 to MAX_RANKS."""
    if not 1 <= np <= MAX_RANKS:
        raise LauncherError(f"-np {np}: the number of ranks must be an integer from 1 to {MAX_RANKS}")


def _slots_ok(slots):
    return slots.isdigit() and 1 <= int(slots) <= MAX_SLOTS


def _split_slots(item):
    """``(host, slots or None)`` of "HOST[:SLOTS]" (a bracketed IPv6 address keeps its colons)."""
    if ":" in item and not item.endswith("]"):
        name, _, slots = item.rpartition(":")
        return name, slots
    return item, None


def check_hosts(hosts: str) -> None:
    """LauncherError naming what is wrong with a -H list ("host1:2,host2:2";
    the slot count is optional), before any MPI launcher sees it."""
    if not hosts.strip():
        raise LauncherError("-H needs at least one host, e.g. -H host1:2,host2:2")
    for item in (i.strip() for i in hosts.split(",")):
        name, slots = _split_slots(item)
        if not _HOST.match(name):
            raise LauncherError(f"-H {hosts!r}: {item!r} is not a host name or address "
                                "(expected HOST or HOST:SLOTS, comma-separated)")
        if slots is not None and not _slots_ok(slots):
            raise LauncherError(f"-H {hosts!r}: the slot count of {item!r} must be a "
                                f"positive integer (1 to {MAX_SLOTS})")


def check_hostfile(path: str) -> None:
    """LauncherError for a hostfile that cannot be read or has a bad slot
    count: "HOST:SLOTS" (MPICH) or "HOST slots=N max_slots=M" (Open MPI), one
    host a line, ``#`` comments."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise LauncherError(f"--hostfile {path!r}: cannot read it: {e}") from None
    hosts = 0
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        hosts += 1
        where = f"--hostfile {path!r}, line {number} ({line.strip()!r})"
        name, slots = _split_slots(fields[0])
        if not name:
            raise LauncherError(f"{where}: no host name")
        counts = [] if slots is None else [slots]
        counts += [v for k, _, v in (f.partition("=") for f in fields[1:]) if k in _SLOT_KEYS]
        for count in counts:
            if not _slots_ok(count):
                raise LauncherError(f"{where}: the slot count {count!r} must be a positive "
                                    f"integer (1 to {MAX_SLOTS})")
    if not hosts:
        raise LauncherError(f"--hostfile {path!r}: no host in it")

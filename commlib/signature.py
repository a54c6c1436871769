"""Checking that an object built on every rank (an optimizer wrapper) was
built alike: each rank's signature (a list of comparable entries, such as
options and (name, shape, dtype) of parameters) is gathered, and a
difference raises CollectiveMismatchError on every rank, naming the entries
that differ, before any collective of the object could stall.

Nothing here imports a framework.
"""
from __future__ import annotations

from .errors import CollectiveMismatchError
from .objects import allgather_object


def check_same_everywhere(signature: list, what: str, name: str, process_set=None) -> None:
    """Raises CollectiveMismatchError (on every rank of ``process_set``) if
    ``signature`` differs across its ranks. Collective: every member calls it."""
    sigs = allgather_object(list(signature), name=name, process_set=process_set)
    if all(s == sigs[0] for s in sigs):
        return
    differ = []
    for i in range(max(len(s) for s in sigs)):
        entries = [s[i] if i < len(s) else None for s in sigs]
        if any(e != entries[0] for e in entries):
            differ.append(" vs ".join(f"rank {r}: {e}" for r, e in enumerate(entries)))
    raise CollectiveMismatchError(f"{what} differ across ranks: " + " | ".join(differ[:5]))

"""Gradient groups for the frameworks' DistributedOptimizer and
DistributedGradientTape: Horovod's ``num_groups``/``groups`` arguments and
the partition of gradient indices into grouped allreduces.

Nothing here imports a framework; variables are opaque objects.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence


def resolve_groups(num_groups: int = 0, groups=None):
    """Horovod's ``num_groups``/``groups`` pair to one value: None, a positive
    int (split the gradients into that many groups) or a list of lists of
    variables."""
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`", DeprecationWarning,
                      stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None:
        if isinstance(groups, bool) or not (isinstance(groups, (list, tuple)) or
                                            (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a positive integer or a list of lists of variables")
    return groups


def split_list(items: Sequence, n: int) -> list[list]:
    """``items`` in n contiguous parts of nearly equal length (Horovod's)."""
    d, r = divmod(len(items), n)
    return [list(items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)]) for i in range(n)]


def group_indices(present: Sequence[int], groups, key_of: Callable[[int], Any],
                  group_keys: Callable[[Any], Any] | None = None) -> list[list[int]]:
    """Partitions the gradient indices ``present`` into allreduce groups.

    groups None: one group (one grouped allreduce for everything);
    int n: n contiguous groups; list of lists of variables: those groups
    (matched by ``key_of(index)`` == ``group_keys(variable)``), every index in
    no list forming a group of its own. Empty groups are dropped.
    """
    present = list(present)
    if groups is None:
        return [present] if present else []
    if isinstance(groups, int):
        return [g for g in split_list(present, min(groups, max(len(present), 1))) if g]
    group_keys = group_keys or (lambda v: v)
    where = {}
    for gi, group in enumerate(groups):
        for var in group:
            where.setdefault(group_keys(var), gi)
    split: list[list[int]] = [[] for _ in groups]
    alone = []
    for i in present:
        gi = where.get(key_of(i))
        if gi is None:
            alone.append([i])
        else:
            split[gi].append(i)
    return [g for g in split if g] + alone

"""Optimizer state of a ZeRO bucket, between its two shapes: the shard form
(one tensor of ``shard`` elements per element-wise key, e.g. Adam's
``exp_avg``, plus per-tensor values such as ``step``) and the ordinary
per-parameter form of ``torch.optim`` state dicts."""
from __future__ import annotations

from collections import defaultdict

import torch

from commlib.sharding import locate


def is_elementwise(value, shard: int) -> bool:
    """A shard state value that holds one entry per shard element."""
    return torch.is_tensor(value) and tuple(value.shape) == (shard,)


def _copy(value):
    return value.detach().clone() if torch.is_tensor(value) else value


def _elementwise_keys(plan, states: dict) -> set:
    """Keys of per-parameter ``states`` (name -> state) that hold one entry per
    parameter element: a value shaped like its parameter (for 0-d parameters,
    where ``step`` looks the same, every key but ``step``)."""
    out, scalar = set(), set()
    for s in plan.slots:
        st = states.get(s.name) or {}
        for k, v in st.items():
            if not torch.is_tensor(v):
                scalar.add(k)
            elif len(s.shape) > 0:
                (out if tuple(v.shape) == s.shape else scalar).add(k)
            elif k != "step" and v.dim() == 0:
                out.add(k)
            else:
                scalar.add(k)
    return out - scalar


def shard_from_params(plan, pos: int, states: dict, dtype) -> dict | None:
    """This rank's shard state of bucket ``plan`` from per-parameter states
    (name -> state dict, missing names: no state yet). None when no parameter
    of the bucket has state."""
    present = [states[s.name] for s in plan.slots if states.get(s.name)]
    if not present:
        return None
    elementwise = _elementwise_keys(plan, states)
    out = {}
    for k in sorted({k for st in present for k in st}):
        if k not in elementwise:
            out[k] = _copy(next(st[k] for st in present if k in st))
            continue
        first = next(st[k] for st in present if k in st)
        t = torch.zeros(plan.shard, dtype=first.dtype)
        for slot, lo, hi, at in plan.owned_slots(pos):
            v = (states.get(slot.name) or {}).get(k)
            if v is not None:
                t[at:at + hi - lo].copy_(v.detach().reshape(-1)[lo:hi])
        out[k] = t
    return out


def params_from_full(plan, full: dict) -> dict:
    """Per-parameter states (name -> state) from a bucket's whole state:
    element-wise keys as flat padded tensors of ``plan.padded`` elements,
    the others as values."""
    out = {}
    for s in plan.slots:
        st = {}
        for k, v in full.items():
            if torch.is_tensor(v) and tuple(v.shape) == (plan.padded,):
                st[k] = v[s.offset:s.offset + s.numel].view(s.shape).clone()
            else:
                st[k] = _copy(v)
        out[s.name] = st
    return out


def torch_order(optimizer, names: dict) -> list:
    """The parameters of ``optimizer`` in the order torch numbers them in a
    state dict (param group by param group), as (index, parameter, name)."""
    out, i = [], 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            out.append((i, p, names.get(p)))
            i += 1
    return out


def shard_state_from_saved(plan, pos: int, old: list, saved) -> dict:
    """Rank ``pos``'s shard state of bucket ``plan``, read by parameter name
    from the shards of a checkpoint with layout ``old`` (``saved.bucket(rank,
    bucket index)`` gives a saved rank's ``{"param", "state"}``)."""
    st = {}
    for slot, lo, hi, at in plan.owned_slots(pos):
        for rank, obi, oat, count, dst in locate(old, slot.name, lo, hi):
            for k, v in saved.bucket(rank, obi)["state"].items():
                if is_elementwise(v, old[obi].shard):
                    t = st.setdefault(k, torch.zeros(plan.shard, dtype=v.dtype))
                    t[at + dst:at + dst + count].copy_(v[oat:oat + count])
                elif k not in st:
                    st[k] = v.clone() if torch.is_tensor(v) else v
    return st


def group_hyperparameters(optimizer) -> list:
    """The param groups without their parameters (what LR schedulers change)."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def owned_state(buckets, inner_state) -> defaultdict:
    """The per-parameter view of this rank's shard state (ZeroMixin.state):
    parameter -> {key: value} for every parameter with elements in this
    rank's shard. Element-wise values are views of the shard's: shaped like
    the parameter when the shard holds all of it, else 1-D over the owned
    elements (``owned_elements``); other values (``step``) are shared."""
    out = defaultdict(dict)
    for b in buckets:
        st = inner_state.get(b.shard)
        if not st:
            continue
        for i, lo, hi, at in b.plan.slots_in(*b.plan.owned(b.pos)):
            p, whole = b.params[i], hi - lo == b.plan.slots[i].numel
            out[p] = {k: (v[at:at + hi - lo].view(p.shape) if whole else v[at:at + hi - lo])
                      if is_elementwise(v, b.plan.shard) else v for k, v in st.items()}
    return out


def owned_elements(bucket, p) -> tuple | None:
    """(lo, hi): the elements of ``p.reshape(-1)`` in this rank's shard of
    ``bucket``; None if it holds none."""
    s = bucket.slot_of(p)
    a, b = bucket.plan.owned(bucket.pos)
    lo, hi = max(a, s.offset), min(b, s.offset + s.numel)
    return (lo - s.offset, hi - s.offset) if lo < hi else None

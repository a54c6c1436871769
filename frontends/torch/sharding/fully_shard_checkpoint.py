"""Checkpoints of a fully_shard model (ZeRO stage 3) and its optimizer, in
the format of zero_checkpoint (one ``shard-<i>.pt`` per rank, ``meta.pt``):

    hvd.save_sharded("ckpt", model, opt)   # opt: the plain torch optimizer over the shards
    hvd.load_sharded("ckpt", model, opt)   # at any number of ranks

Each fully_shard group is one saved bucket whose slots carry the
parameters' names in ``model`` (``blocks.0.weight``), so a checkpoint loads
at another world size (every rank reads the pieces of its new shard by name,
memory-mapped, with no communication) and into a model sharded by other
fully_shard calls. The optimizer's state of a shard must be element-wise
(SGD momentum, Adam, ...), as for ZeRO stages 1-2. ``full_state_dict``
gathers an ordinary model and optimizer state dict (``full_state``).
"""
from __future__ import annotations

import os

import torch

from commlib.ops import check_root
from commlib.process_sets import set_rank, set_size
from commlib.sharding import Bucket, Slot, locate

from .. import mpi_ops as _ops
from .fully_shard import groups_of
from .zero_state import (group_hyperparameters, is_elementwise, params_from_full,
                         shard_state_from_saved)


def _process_set(groups):
    sets = {id(g.process_set): g.process_set for g in groups}
    if len(sets) > 1:
        raise ValueError("save_sharded/load_sharded of fully_shard models need every "
                         "fully_shard call on one process set")
    return groups[0].process_set


def _named_plan(group, module_names) -> Bucket:
    """The group's layout with each slot named as the parameter is in the model."""
    slots = [Slot(f"{module_names[m]}.{n}".lstrip("."), s.shape, s.offset)
             for m, n, s in group.places]
    return Bucket(group.plan.dtype, 0, group.plan.world, slots)


def _check_optimizer(optimizer, groups):
    shards = {id(p) for g in optimizer.param_groups for p in g["params"]}
    missing = [g.name for g in groups if id(g.shard) not in shards and g.shard.requires_grad]
    if missing:
        raise ValueError("the optimizer does not hold the shards of every fully_shard module "
                         "(build it over model.parameters() after fully_shard)")


def save(directory, model, optimizer, write_shard, write_meta) -> None:
    """Writes this rank's shards (``write_shard(obj, pos)``) and, on the
    set's first rank, the metadata (``write_meta(obj)``); then a barrier."""
    groups = groups_of(model)
    ps = _process_set(groups)
    _check_optimizer(optimizer, groups)
    pos = set_rank(ps)
    names = {m: k for k, m in model.named_modules()}
    os.makedirs(directory, exist_ok=True)
    buckets = [{"param": g.shard.detach().clone(),
                "state": {k: v.detach().clone() if torch.is_tensor(v) else v
                          for k, v in optimizer.state.get(g.shard, {}).items()}}
               for g in groups]
    write_shard({"buckets": buckets}, pos)
    if pos == 0:
        shards = {id(g.shard) for g in groups}
        extra = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()
                 if id(v) not in shards}
        write_meta({"version": 1, "world": set_size(ps), "stage": 3,
                    "layout": [_named_plan(g, names).to_dict() for g in groups],
                    "param_groups": group_hyperparameters(optimizer), "model_extra": extra})
    _ops.barrier(process_set=ps)


def load(model, optimizer, meta, saved) -> None:
    """Fills the shards and ``optimizer``'s state from a checkpoint (``meta``
    and ``saved``, zero_checkpoint's reader of the rank files)."""
    groups = groups_of(model)
    ps = _process_set(groups)
    _check_optimizer(optimizer, groups)
    pos = set_rank(ps)
    names = {m: k for k, m in model.named_modules()}
    old = [Bucket.from_dict(d) for d in meta["layout"]]
    extra = meta["model_extra"]
    shards = {id(g.shard) for g in groups}
    current = {k: v for k, v in model.state_dict(keep_vars=True).items() if id(v) not in shards}
    for what, keys in (("the checkpoint has model entries this model lacks",
                        sorted(set(extra) - set(current))),
                       ("this model has entries the checkpoint lacks",
                        sorted(set(current) - set(extra)))):
        if keys:
            raise KeyError(f"{what}: {', '.join(keys[:5])}")
    if len(meta["param_groups"]) != len(optimizer.param_groups):
        raise ValueError(f"the checkpoint has {len(meta['param_groups'])} optimizer param "
                         f"groups, this optimizer {len(optimizer.param_groups)}")
    with torch.no_grad():
        for g in groups:
            plan = _named_plan(g, names)
            for slot, lo, hi, at in plan.owned_slots(pos):
                for rank, obi, oat, count, dst in locate(old, slot.name, lo, hi):
                    piece = saved.bucket(rank, obi)["param"]
                    g.shard[at + dst:at + dst + count].copy_(piece[oat:oat + count])
            state = shard_state_from_saved(plan, pos, old, saved)
            optimizer.state.pop(g.shard, None)
            if state:
                optimizer.state[g.shard] = state
        for k, v in extra.items():
            current[k].copy_(v)
    for group, hyper in zip(optimizer.param_groups, meta["param_groups"]):
        group.update({k: v for k, v in hyper.items() if k != "params"})


def _unsharded_names(model) -> list:
    """The parameters' names in the order ``named_parameters()`` gives them
    for the model before fully_shard (module by module, in registration order)."""
    taken = {}
    for g in groups_of(model):
        for m, n, _ in g.places:
            taken.setdefault(m, []).append(n)
    out = []
    for prefix, m in model.named_modules():
        own = taken.get(m) or [n for n, p in m._parameters.items()
                               if p is not None and n != "_commlib_flat_shard"]
        out += [f"{prefix}.{n}".lstrip(".") for n in own]
    return out


def full_state(model, optimizer, root) -> dict | None:
    """``full_state_dict`` of a fully_shard model: the whole parameters and
    the optimizer state per parameter, numbered as an optimizer with the same
    param groups over the unsharded model's parameters numbers them (each
    group's parameters in the model's order)."""
    groups = groups_of(model)
    ps = _process_set(groups)
    _check_optimizer(optimizer, groups)
    names = {m: k for k, m in model.named_modules()}
    plans = {id(g): _named_plan(g, names) for g in groups}
    handles = []
    for g in groups:
        st = optimizer.state.get(g.shard, {})
        keys = sorted(k for k, v in st.items() if is_elementwise(v, g.plan.shard))
        handles.append((g, st, _ops.allgather_async(g.shard.detach(), name=f"{g.name}.full",
                                                    process_set=ps),
                        {k: _ops.allgather_async(st[k].detach(), name=f"{g.name}.full.{k}",
                                                 process_set=ps) for k in keys}))
    params, states = {}, {}
    for g, st, whole_h, key_h in handles:
        plan = plans[id(g)]
        whole = _ops.synchronize(whole_h)
        for s in plan.slots:
            params[s.name] = whole[s.offset:s.offset + s.numel].view(s.shape).clone()
        full = {k: (_ops.synchronize(key_h[k]) if k in key_h else v) for k, v in st.items()}
        if full:
            states.update(params_from_full(plan, full))
    if root is not None:  # (checked once this rank's part is gathered: the others wait for it)
        check_root(root, ps)
        if _ops.rank() != root:
            return None
    shards = {id(g.shard): g for g in groups}
    order = {name: i for i, name in enumerate(_unsharded_names(model))}
    plain = dict(model.named_parameters())
    plain_names = {id(p): k for k, p in plain.items()}
    state, groups_out, i = {}, [], 0
    for group in optimizer.param_groups:
        members = []
        for p in group["params"]:
            g = shards.get(id(p))
            members += ([s.name for s in plans[id(g)].slots] if g is not None
                        else [plain_names[id(p)]])
        indices = []
        for name in sorted(members, key=lambda k: order.get(k, len(order))):
            if name in states:
                state[i] = states[name]
            elif name in plain:
                p = plain[name]
                if p in optimizer.state:
                    state[i] = {k: v.detach().clone() if torch.is_tensor(v) else v
                                for k, v in optimizer.state[p].items()}
            indices.append(i)
            i += 1
        groups_out.append(dict({k: v for k, v in group.items() if k != "params"},
                               params=indices))
    shard_ids = {id(g.shard) for g in groups}
    model_state = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()
                   if id(v) not in shard_ids}
    model_state.update(params)
    return {"model": model_state, "optimizer": {"state": state, "param_groups": groups_out}}

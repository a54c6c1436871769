"""Checkpoints of a ZeRO DistributedOptimizer (zero_stage 1 or 2) and its model.

    hvd.save_sharded("ckpt", model, opt)    # each rank writes its shard; rank 0 the metadata
    ...
    hvd.load_sharded("ckpt", model, opt)    # at any number of ranks: reshards on load
    full = hvd.full_state_dict(model, opt)  # on rank 0: {"model": ..., "optimizer": ...}

``save_sharded`` writes ``shard-<i>.pt`` per rank of the optimizer's process
set (its shard of the parameters and of the optimizer state, per bucket) and
``meta.pt`` (the bucket layout, world size, param-group hyperparameters and
the model's other state: buffers, parameters the optimizer does not shard);
it communicates nothing but a barrier. ``load_sharded`` needs no
communication: every rank reads the pieces it needs from the saved shards
(memory-mapped), by parameter name, so the saving and loading world sizes,
stages and bucket sizes may differ. ``full_state_dict`` gathers an ordinary
torch model state dict and optimizer state dict (loadable into a plain
optimizer, or into a ZeRO one at any size through ``load_state_dict``).
"""
from __future__ import annotations

import os

import torch

from commlib.ops import check_root
from commlib.process_sets import set_rank, set_size
from commlib.sharding import Bucket, locate

from . import fully_shard_checkpoint as _fsdp
from .. import mpi_ops as _ops
from .zero_state import (group_hyperparameters, is_elementwise, params_from_full,
                         shard_state_from_saved, torch_order)

META = "meta.pt"


def _shard_path(directory, pos: int) -> str:
    return os.path.join(directory, f"shard-{pos:05d}.pt")


def _zero(optimizer, model=None):
    if getattr(optimizer, "zero_buckets", None) is None:
        what = "DistributedOptimizer built with zero_stage=1 or 2 on this rank"
        if model is not None:
            what += ", or a model with fully_shard modules"
        raise TypeError(f"expected a commlib.torch.{what}, got {type(optimizer).__name__}")
    return optimizer


def _fully_shard(model, optimizer) -> bool:
    """Whether this is a fully_shard model with its plain optimizer (stage 3)."""
    return getattr(optimizer, "zero_buckets", None) is None and bool(_fsdp.groups_of(model))


def _managed(optimizer) -> set:
    return {id(p) for b in optimizer.zero_buckets for p in b.params}


def _save(obj, path):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_sharded(directory, model, optimizer) -> None:
    """Writes this rank's shard (and, on the set's first rank, the metadata)
    into ``directory``; returns when every rank of the set has written.
    ``optimizer``: a ZeRO DistributedOptimizer (stages 1-2), or the plain
    optimizer of a model with fully_shard modules (stage 3)."""
    if _fully_shard(model, optimizer):
        _fsdp.save(directory, model, optimizer,
                   lambda obj, pos: _save(obj, _shard_path(directory, pos)),
                   lambda obj: _save(obj, os.path.join(directory, META)))
        return
    opt = _zero(optimizer, model)
    pos = set_rank(opt.process_set)
    os.makedirs(directory, exist_ok=True)
    shards = [{"param": b.shard.detach().clone(), "state": dict(st)}
              for b, st in zip(opt.zero_buckets, opt.shard_states())]
    _save({"buckets": shards}, _shard_path(directory, pos))
    if pos == 0:
        managed = _managed(opt)
        extra = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()
                 if id(v) not in managed}
        _save({"version": 1, "world": set_size(opt.process_set), "stage": opt.zero_stage,
               "layout": [b.plan.to_dict() for b in opt.zero_buckets],
               "param_groups": group_hyperparameters(opt), "model_extra": extra},
              os.path.join(directory, META))
    _ops.barrier(process_set=opt.process_set)


class _SavedShards:
    """The saved rank files, opened (memory-mapped) on first use."""

    def __init__(self, directory, world: int):
        self.directory, self.world, self._open = directory, world, {}

    def bucket(self, pos: int, bi: int) -> dict:
        if pos not in self._open:
            path = _shard_path(self.directory, pos)
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path} is missing: the checkpoint was saved by "
                                        f"{self.world} ranks")
            self._open[pos] = torch.load(path, mmap=True, weights_only=True)["buckets"]
        return self._open[pos][bi]


def load_sharded(directory, model, optimizer) -> None:
    """Loads a checkpoint written by ``save_sharded`` at any world size into
    ``model`` and ``optimizer`` (a ZeRO DistributedOptimizer built the same
    way, at any zero_stage): every rank reads its parameters and its shard
    of the optimizer state. No communication. Also for a model with
    fully_shard modules and its plain optimizer (see fully_shard_checkpoint)."""
    path = os.path.join(directory, META)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: not a directory written by save_sharded")
    fsdp = _fully_shard(model, optimizer)
    if not fsdp:
        _zero(optimizer, model)
    meta = torch.load(path, weights_only=True)
    saved = _SavedShards(directory, int(meta["world"]))
    if fsdp:
        _fsdp.load(model, optimizer, meta, saved)
        return
    opt = optimizer
    old = [Bucket.from_dict(d) for d in meta["layout"]]
    extra = meta["model_extra"]
    current = model.state_dict()
    managed = _managed(opt)
    unsaved = sorted(k for k, v in model.state_dict(keep_vars=True).items()
                     if id(v) not in managed and k not in extra)
    for what, keys in (("the checkpoint has model entries this model lacks",
                        sorted(set(extra) - set(current))),
                       ("this model has entries the checkpoint lacks", unsaved)):
        if keys:
            raise KeyError(f"{what}: {', '.join(keys[:5])}")
    states = []
    for b in opt.zero_buckets:
        for s in b.plan.slots:
            view = b.flat[s.offset:s.offset + s.numel]
            for pos, obi, at, count, dst in locate(old, s.name, 0, s.numel):
                view[dst:dst + count].copy_(saved.bucket(pos, obi)["param"][at:at + count])
        states.append(shard_state_from_saved(b.plan, b.pos, old, saved))
    with torch.no_grad():
        for k, v in extra.items():
            current[k].copy_(v)
    opt.load_shards(states, meta["param_groups"])


def full_state_dict(model, optimizer, root=0):
    """{"model": model.state_dict(), "optimizer": an ordinary torch optimizer
    state dict} gathered on rank ``root`` (a job rank of the optimizer's set;
    None: on every rank); None elsewhere. Collective over the set. For a
    model with fully_shard modules (and its plain optimizer), parameters are
    numbered as in an optimizer over the unsharded model
    (fully_shard_checkpoint.full_state)."""
    if _fully_shard(model, optimizer):
        return _fsdp.full_state(model, optimizer, root)
    opt = _zero(optimizer, model)
    ps = opt.process_set
    gathered, per_name = [], {}
    for i, (b, st) in enumerate(zip(opt.zero_buckets, opt.shard_states())):
        handles = {k: _ops.allgather_async(v.detach(), name=f"{opt.name_prefix}zero{i}.full.{k}",
                                           process_set=ps)
                   for k, v in sorted(st.items()) if is_elementwise(v, b.plan.shard)}
        gathered.append((b, st, handles))
    for b, st, handles in gathered:
        full = {k: (_ops.synchronize(handles[k]) if k in handles else v) for k, v in st.items()}
        if full:
            per_name.update(params_from_full(b.plan, full))
    if root is not None:  # (checked once this rank's part is gathered: the others wait for it)
        check_root(root, ps)
        if _ops.rank() != root:
            return None
    order = torch_order(opt, opt.parameter_names)
    state = {i: per_name[name] for i, _, name in order if name in per_name}
    groups, index = [], {id(p): i for i, p, _ in order}
    for g in opt.param_groups:
        groups.append(dict({k: v for k, v in g.items() if k != "params"},
                           params=[index[id(p)] for p in g["params"]]))
    return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": {"state": state, "param_groups": groups}}

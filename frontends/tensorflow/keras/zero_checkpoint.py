"""Sharded checkpoints of a Keras model and its ZeRO DistributedOptimizer.

    hvd.save_sharded("ckpt", model, opt)   # each rank writes its shard; rank 0 the metadata
    ...
    hvd.load_sharded("ckpt", model, opt)   # at any number of ranks: reshards on load

``save_sharded`` writes, per rank, that rank's shard of the parameters and
of the optimizer state (per bucket, as numpy arrays; commlib.shard_store),
and on rank 0 ``meta.json`` (the bucket layout, world size, iteration and
learning rate) and the model's other variables (non-trainable ones: batch
norm statistics, frozen weights, seed states) by path. It communicates
nothing but a barrier. ``load_sharded`` communicates nothing: every rank
reads its parameters (whole) and its optimizer-state shard (memory-mapped)
by variable path, so the saving and loading world sizes, stages and bucket
sizes may differ; the model must have the same variable paths.
"""
from __future__ import annotations

import numpy as np

from commlib.basics import rank, size
from commlib.shard_store import (SavedArrays, read_meta, read_range, read_shard,
                                 shard_folder, write_arrays, write_meta)
from commlib.sharding import Bucket

from .. import mpi_ops as _ops
from .zero import variable_names

VERSION = 1


def _zero(optimizer, model=None):
    if getattr(optimizer, "zero_stage", None) not in (1, 2):
        raise TypeError("expected a commlib.tensorflow.keras.DistributedOptimizer built with "
                        f"zero_stage=1 or 2, got {type(optimizer).__name__}")
    if not optimizer.built:
        if model is None:
            raise ValueError("the optimizer has not been built yet: nothing to save")
        optimizer.build(model.trainable_variables)
    return optimizer


def _extra_variables(model, optimizer) -> dict:
    """The model's variables the optimizer does not shard, by unique path."""
    managed = {id(v) for v in optimizer.zero_variables().values()}
    others = [v for v in model.variables if id(v) not in managed]
    return dict(zip(variable_names(others), others))


def _learning_rate(optimizer):
    lr = optimizer._learning_rate
    return float(np.asarray(lr.numpy())) if hasattr(lr, "assign") else None


def save_sharded(directory, model, optimizer) -> None:
    """Writes this rank's shard (and, on rank 0, the metadata and the model's
    other variables) into ``directory``; returns when every rank has written."""
    opt = _zero(optimizer)
    pos = rank()
    arrays = {}
    for i, st in enumerate(opt.shard_states()):
        arrays[f"b{i}.param"] = opt.zero_local_shard(i, pos).numpy()
        for k, v in sorted(st.items()):
            arrays[f"b{i}.{k}"] = np.asarray(v.numpy())
    write_arrays(shard_folder(directory, pos), arrays)
    if pos == 0:
        extra = _extra_variables(model, opt)
        write_arrays(shard_folder(directory, "extra"),
                     {k: np.asarray(v.numpy()) for k, v in extra.items()})
        write_meta(directory, {"version": VERSION, "world": size(), "stage": opt.zero_stage,
                               "layout": [b.to_dict() for b in opt.zero_buckets],
                               "iterations": int(opt._iterations.numpy()),
                               "learning_rate": _learning_rate(opt)})
    _ops.barrier()


def load_sharded(directory, model, optimizer) -> None:
    """Loads a checkpoint written by ``save_sharded`` at any world size into
    ``model`` and ``optimizer`` (a ZeRO DistributedOptimizer of the same
    class, at any zero_stage; built here on ``model.trainable_variables`` if
    it is not yet). No communication."""
    meta = read_meta(directory)
    opt = _zero(optimizer, model)
    old = [Bucket.from_dict(d) for d in meta["layout"]]
    saved = SavedArrays(directory, int(meta["world"]))
    variables, values = opt.zero_variables(), {}
    for name, v in variables.items():
        flat = np.empty(int(np.prod(v.shape, dtype=np.int64)), dtype=str(v.dtype))
        read_range(old, saved, name, 0, flat.size, "param", flat)
        values[name] = flat.reshape(tuple(v.shape))
    extra = _extra_variables(model, opt)
    saved_extra = set(saved.keys("extra"))
    for what, keys in (("the checkpoint has model variables this model lacks",
                        sorted(saved_extra - set(extra))),
                       ("this model has variables the checkpoint lacks",
                        sorted(set(extra) - saved_extra))):
        if keys:
            raise KeyError(f"{what}: {', '.join(keys[:5])}")
    states = [{k: read_shard(b, rank(), old, saved, k, str(var.dtype))
               for k, var in st.items()}
              for b, st in zip(opt.zero_buckets, opt.shard_states())]
    # everything read: now assign (a failed read leaves the model as it was)
    for name, value in values.items():
        variables[name].assign(value)
    for k, v in extra.items():
        v.assign(np.asarray(saved.array("extra", k)))
    opt.zero_reload_shards(rank())
    for st, arrays in zip(opt.shard_states(), states):
        for k, var in st.items():
            var.assign(arrays[k])
    opt._iterations.assign(int(meta["iterations"]))
    if meta["learning_rate"] is not None and hasattr(opt._learning_rate, "assign"):
        opt._learning_rate.assign(meta["learning_rate"])

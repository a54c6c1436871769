"""commlib.torch.elastic: Horovod's ``horovod.torch.elastic`` names on
commlib's restart-from-the-last-commit mode (see :mod:`commlib.elastic`)::

    import commlib.torch as hvd

    hvd.init()
    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            while state.batch < batches:             # state.batch: batches done
                step(state.epoch, state.batch)
                state.batch += 1
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0

    train(state)

launched as ``COMMLIB_ELASTIC_DIR=/shared/ckpt commlibrun -np 4 --restarts 3
python train.py``. When a rank fails, commlibrun starts the job again and
``train`` resumes from the newest commit that every rank finished.
"""
from __future__ import annotations

import copy
import io

import torch

from commlib.elastic import ELASTIC_DIR_ENV, ElasticStateError, ObjectState, State, run  # noqa: F401

from .collectives.state_sync import (allgather_object, broadcast_object, broadcast_parameters,
                                     broadcast_state)
from .elastic_sampler import ElasticSampler
from .sharding.fully_shard import groups_of

# The state_dict key suffix of fully_shard's flat parameter shards.
SHARD_KEY = "_commlib_flat_shard"

__all__ = ["TorchState", "ElasticSampler", "ObjectState", "State", "run", "ElasticStateError",
           "ELASTIC_DIR_ENV"]


class TorchState(State):
    """A model's ``state_dict``, an optimizer's ``state_dict`` and any user
    values given as keywords (``state.epoch``...). Either object may be None.
    An ElasticSampler given as a keyword (``sampler=...``) is committed as
    its epoch and processed indices; ``sync()`` merges every rank's
    processed indices.

    ``commit()`` (a collective: every rank at the same points) keeps a copy
    and writes each rank's part to ``$COMMLIB_ELASTIC_DIR``; ``restore()``
    returns to the last commit in memory; ``sync()`` gives every rank rank
    0's state, except sharded state (a ``fully_shard`` model's shards, a
    ZeRO optimizer's state), which stays each rank's own part. With
    ``DistributedOptimizer(staleness=1, weight_prediction=True)`` the true
    weights are committed, not the prediction the model holds between
    steps; a restore drops a pending average and a pending streaming
    ``LocalSGD`` meeting (the next step applies nothing). See
    :mod:`commlib.elastic` for the commit protocol and its guarantees."""

    def __init__(self, model=None, optimizer=None, **user_state):
        for what, obj in (("model", model), ("optimizer", optimizer)):
            if obj is not None and not (callable(getattr(obj, "state_dict", None))
                                        and callable(getattr(obj, "load_state_dict", None))):
                raise TypeError(f"TorchState's {what} must have state_dict() and load_state_dict() "
                                f"(a torch.nn.Module, a torch.optim.Optimizer), got {type(obj).__name__}")
        self.model = model
        self.optimizer = optimizer
        # ElasticSamplers given as keywords (state.sampler...) keep their
        # epoch and processed indices in the commits, not the whole sampler.
        self.samplers = {k: v for k, v in user_state.items() if isinstance(v, ElasticSampler)}
        for key, sampler in self.samplers.items():
            setattr(self, key, sampler)
        super().__init__(**{k: v for k, v in user_state.items() if k not in self.samplers})

    def _snapshot(self) -> dict:
        snap = {}
        if self.model is not None:
            snap["model"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            # Weight prediction (staleness=1): the model holds predicted
            # weights between steps; commit the true ones (restoring loads the
            # optimizer's state after the model's, which drops the prediction).
            true_weights = getattr(self.optimizer, "true_weights", None)
            true = true_weights() if true_weights is not None else {}
            for name, p in self.model.named_parameters():
                if id(p) in true:
                    snap["model"][name] = true[id(p)].detach().clone()
        if self.optimizer is not None:
            snap["optimizer"] = copy.deepcopy(self.optimizer.state_dict())
        snap["samplers"] = {k: s.state_dict() for k, s in self.samplers.items()}
        return snap

    def _apply(self, snapshot: dict) -> None:
        if self.model is not None:
            self.model.load_state_dict(snapshot["model"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(copy.deepcopy(snapshot["optimizer"]))
        for key, saved in snapshot.get("samplers", {}).items():
            if key in self.samplers:
                self.samplers[key].load_state_dict(saved)

    def _sync_objects(self, root_rank: int) -> None:
        # Sharded state (fully_shard's flat shards, a ZeRO optimizer's or a
        # sharded model's optimizer state) is each rank's own part: loaded
        # from the same commit, or trained in step, it already agrees, and
        # rank 0's part must not overwrite the others'. Commits write shards.
        if self.model is not None:
            replicated = {k: v for k, v in self.model.state_dict().items() if not k.endswith(SHARD_KEY)}
            broadcast_parameters(replicated, root_rank=root_rank, prefix="elastic.model")
        if self.optimizer is not None and not self._sharded_optimizer_state():
            broadcast_state(self.optimizer, root_rank=root_rank, prefix="elastic.optimizer")
        for key in sorted(self.samplers):  # (every rank in the same order)
            # What any rank processed is processed: each rank's share after
            # this excludes it.
            sampler = self.samplers[key]
            name = f"elastic.sampler.{key}"
            done = set().union(*allgather_object(sampler.processed_indices, name=name))
            merged = dict(sampler.state_dict(), processed_indices=done)
            sampler.load_state_dict(broadcast_object(merged, root_rank, name=name + ".state"))

    def _sharded_optimizer_state(self) -> bool:
        """Whether the optimizer holds state that is sharded across ranks."""
        if getattr(self.optimizer, "zero_stage", 0) > 0:
            return any(self.optimizer.state_dict()["shard_state"])
        sharded_model = self.model is not None and bool(groups_of(self.model))
        return sharded_model and len(self.optimizer.state) > 0

    def _serialize(self, snapshot: dict) -> bytes:
        buf = io.BytesIO()
        torch.save(snapshot, buf)
        return buf.getvalue()

    def _deserialize(self, data: bytes) -> dict:
        # Commits are this job's own files (as trusted as any checkpoint).
        return torch.load(io.BytesIO(data), weights_only=False)

"""commlib.torch.elastic.ElasticSampler: Horovod's sampler for elastic jobs.

Like torch's DistributedSampler it gives each rank an equal share of a
dataset's indices (a few repeated so that every share has the same
length), in an order drawn from ``seed + epoch`` when shuffled. It also
records which indices have been processed this epoch (``record_batch``);
they are part of its state (``state_dict``), so TorchState commits them
with the model, and after a restart the epoch goes on with the indices not
processed yet, split anew among the ranks::

    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            for idx, (x, y) in enumerate(loader):
                step(x, y)
                state.sampler.record_batch(idx, 32)
                if idx % 10 == 9:
                    state.commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)   # at the end of the epoch
            state.commit()

``state.sync()`` (run by ``@hvd.elastic.run``) merges the processed indices
of every rank, so each rank's share after it excludes what any rank did.
"""
from __future__ import annotations

import math

import torch

from commlib.basics import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """This rank's share of ``range(len(dataset))`` less the indices recorded
    as processed this epoch; shuffled (``seed + epoch``) if ``shuffle``."""

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set = set()
        self.indices: list = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch``: its own order, nothing processed yet. Call
        it when an epoch ends (not when one starts, which would forget the
        progress of an epoch resumed after a restart)."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Records the indices of batch ``batch_idx`` (of ``batch_size``) of
        this rank's current iteration as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices) -> None:
        """Records dataset indices as processed."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list:
        """The dataset indices of batch ``batch_idx`` of this rank's share."""
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self) -> None:
        """Splits the indices not processed yet among the job's ranks (called
        after every change of epoch or of the processed indices)."""
        self.num_replicas, self.rank = size(), rank()
        n = len(self.dataset)
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=generator).tolist()
        else:
            order = range(n)
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.indices = self._share()

    def _share(self) -> list:
        remaining = self.remaining_indices
        if not remaining:
            return []
        repeats = math.ceil(self.total_size / len(remaining))  # (the first ones again, to even out)
        padded = (remaining * repeats)[:self.total_size]
        return padded[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        self.indices = self._share()
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples

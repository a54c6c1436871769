"""Stage 2's gradient reduce-scatter without a large allocation per step.

A bucket's gradients have to reach the reduce-scatter in its padded
``(world, shard)`` layout. Packing them into a new bucket-sized tensor every
step costs more than it seems on CPU: allocations that large are fresh
``mmap`` s, so every page is faulted in again each step. Instead the bucket is
reduce-scattered in column slices ``[c0, c1)`` of that layout: the slice's
``(world, c1 - c0)`` block (row k: bucket elements ``k*shard + c0 ..
k*shard + c1``) is copied into a small persistent staging slot and reduced
into ``grad_shard[c0:c1]``, this rank's persistent shard gradient (which
stage 2 keeps after the step anyway). Each element is reduced as in one
whole-bucket reduce-scatter (same inputs, same rank order), so the result is
the same bit for bit.

The staging memory (``staging_bytes``, split into ``SLOTS`` slots) is
reused ring-wise: filling a slot first waits for the collective that last
used it, so up to ``SLOTS`` slices are in flight while the next is packed.
"""
from __future__ import annotations

import torch

import commlib as _c
from commlib.sharding import Bucket

from .handles import Handle
from .tensor_io import as_array

DEFAULT_STAGING_BYTES = 4 << 20
SLOTS = 2


def check_staging_bytes(value) -> int:
    """ValueError unless ``value`` is None (the default) or a positive int."""
    if value is None:
        return DEFAULT_STAGING_BYTES
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"staging_bytes must be a positive int, got {value!r}")
    return value


def reducescatter_into_async(tensor: torch.Tensor, out: torch.Tensor, name: str, op,
                             process_set, prescale: float = 1.0, postscale: float = 1.0) -> Handle:
    """Reduce-scatter of the contiguous CPU ``tensor`` whose part for this
    rank is written into ``out`` (contiguous, of that part's shape); the
    handle's result is ``out``."""
    h = _c.reducescatter_async(as_array(tensor), op, name, prescale, postscale,
                               process_set=process_set, out=as_array(out))
    return Handle(h, lambda _arr: out, (tensor, out))


class GradStager:
    """The staging slots of one optimizer and the slices in flight."""

    def __init__(self, staging_bytes: int):
        self._bytes = staging_bytes
        self._slots = []  # [buffer (uint8), handle in flight or None]
        self._next = 0
        self._error = None
        self._slices = {}  # id(plan) -> (plan, width, its column slices)

    def _slot(self):
        """The next slot, free: waits for the collective that last used it."""
        if not self._slots:
            per = max(1, self._bytes // SLOTS)
            self._slots = [[torch.zeros(per, dtype=torch.uint8), None] for _ in range(SLOTS)]
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        self._settle(slot)
        return slot

    def _settle(self, slot):
        h, slot[1] = slot[1], None
        if h is not None:
            try:
                _c.synchronize(h._handles)
            except Exception as e:  # noqa: BLE001 - raised by wait_all, after every slice
                self._error = self._error or e

    def start(self, plan: Bucket, grads: list, out: torch.Tensor, name: str, op, process_set,
              scales=(1.0, 1.0)) -> None:
        """Starts reduce-scattering ``grads`` (one tensor or None per
        parameter of ``plan``, in slot order) into ``out`` (this rank's
        shard, contiguous), slice by slice; ``wait_all`` finishes it."""
        dtype = out.dtype
        width = max(1, self._bytes // SLOTS // out.element_size() // plan.world)
        cached = self._slices.get(id(plan))
        if cached is None or cached[0] is not plan or cached[1] != width:
            cached = self._slices[id(plan)] = (plan, width, plan.column_slices(width))
        flat_grads = [None if g is None else g.reshape(-1) for g in grads]
        for j, (c0, c1, rows) in enumerate(cached[2]):
            slot = self._slot()
            n = c1 - c0
            block = slot[0][:plan.world * n * out.element_size()].view(dtype).view(plan.world, n)
            for k, pieces in enumerate(rows):
                _fill_row(block[k], pieces, flat_grads)
            slot[1] = reducescatter_into_async(block, out[c0:c1].view(1, n),
                                               f"{name}.{j}", op, process_set, *scales)

    def wait_all(self) -> None:
        """Waits for every slice in flight; raises the first error."""
        for slot in self._slots:
            self._settle(slot)
        error, self._error = self._error, None
        if error is not None:
            raise error


def _fill_row(row: torch.Tensor, pieces: list, flat_grads: list) -> None:
    end = 0
    for i, lo, hi, at in pieces:
        if at > end:
            row[end:at].zero_()
        g = flat_grads[i]
        if g is None:
            row[at:at + hi - lo].zero_()
        else:
            row[at:at + hi - lo].copy_(g[lo:hi])
        end = at + hi - lo
    if end < row.numel():
        row[end:].zero_()  # the padding

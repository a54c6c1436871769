"""A ZeRO bucket's gradients reduce-scattered where they lie.

A bucket's gradients have to reach the reduce-scatter in its padded
``(world, shard)`` layout: parameter after parameter, then the padding. They
are handed to ``commlib.reducescatter_pieces`` as they are (one piece per
parameter, a count of zeros for a parameter without a gradient and for the
padding), and the core reads each piece in place while it reduces: nothing
packs them into a bucket-sized tensor first (a 50 MB copy per step for a 12.5 M
parameter model), and nothing is allocated. Each rank receives its shard's
reduced gradient in ``out``, exactly as a reduce-scatter of the packed
bucket would give it.
"""
from __future__ import annotations

import torch

import commlib as _c
from commlib.sharding import Bucket

from ..collectives.handles import Handle
from ..collectives.tensor_io import as_array


def grad_pieces(plan: Bucket, grads: list) -> tuple[list, list]:
    """(pieces, tensors to keep alive) for ``grads`` (a tensor or None per
    parameter of ``plan``, in slot order) in the bucket's flat layout."""
    pieces, keep, end = [], [], 0
    for s, g in zip(plan.slots, grads):
        if s.offset > end:
            pieces.append(s.offset - end)
        if g is None:
            pieces.append(s.numel)
        else:
            if g.is_sparse:
                g = g.to_dense()
            g = g.detach().reshape(-1)
            if not g.is_contiguous():
                g = g.contiguous()
            keep.append(g)
            pieces.append(as_array(g))
        end = s.offset + s.numel
    if plan.padded > end:
        pieces.append(plan.padded - end)
    return pieces, keep


def reducescatter_grads_async(plan: Bucket, grads: list, out: torch.Tensor, name: str, op,
                              process_set, scales=(1.0, 1.0)) -> Handle:
    """Starts reduce-scattering ``grads`` (see ``grad_pieces``) into ``out``
    (this rank's shard, contiguous, ``plan.shard`` elements); the handle's
    result is ``out``. The gradients must not change until it completes."""
    pieces, keep = grad_pieces(plan, grads)
    dtype = as_array(out[:0]).dtype
    h = _c.reducescatter_pieces_async(pieces, (plan.world, plan.shard), dtype, op, name,
                                      scales[0], scales[1], process_set=process_set,
                                      out=as_array(out).reshape(1, plan.shard))
    return Handle(h, lambda _arr: out, (keep, out))

"""DistributedOptimizer(sparse_as_dense=True): a sparse gradient is reduced
as a dense tensor and handed back to the optimizer as a sparse one (as
Horovod does), so optimizers that take only sparse gradients
(``torch.optim.SparseAdam``) train with either setting.

The sparse gradient given back holds exactly the positions some rank's
gradient touched (not just the nonzero ones: a touched row whose averaged
gradient is zero still moves SparseAdam's moments, as it would in one
process on the combined batch). Each rank marks the positions its gradient
touched (over the gradient's sparse dimensions) in a mask; one allreduce
(Max) of all masks gives their union, the same on every rank.
"""
from __future__ import annotations

import numpy as np
import torch


def touched(grad) -> tuple:
    """(sparse_dim, indices of the touched positions) of a sparse gradient."""
    g = grad.coalesce()
    return g.sparse_dim(), g.indices()


def mask_of(shape, sparse_dim: int, record) -> np.ndarray:
    """This rank's mask (uint8, flat) over ``shape[:sparse_dim]``: 1 where its
    gradient touched (a gradient with fewer sparse dimensions marks whole
    blocks); zeros without a gradient (``record`` None)."""
    mask = torch.zeros(tuple(shape[:sparse_dim]), dtype=torch.uint8)
    if record is not None:
        _, idx = record
        mask[tuple(idx)] = 1
    return mask.reshape(-1).numpy()


def to_sparse(dense, sparse_dim: int, mask) -> torch.Tensor:
    """The positions of ``mask`` (flat, over ``dense.shape[:sparse_dim]``) of
    the reduced ``dense`` gradient, as a coalesced sparse COO tensor."""
    lead = tuple(dense.shape[:sparse_dim])
    idx = torch.from_numpy(np.asarray(mask)).reshape(lead).nonzero().t()
    values = dense[tuple(idx)]
    return torch.sparse_coo_tensor(idx, values, tuple(dense.shape), is_coalesced=True)

"""barrier and join on torch's side (join picks the CUDA device of this
rank's collectives)."""
from __future__ import annotations

import torch

import commlib as _c
from commlib.checks import integer
from commlib.process_sets import check_process_set, global_process_set


def barrier(process_set=global_process_set) -> None:
    """Returns once every rank (of ``process_set``) has called barrier()."""
    _c.barrier(process_set=check_process_set(process_set))


def join(device=-1) -> int:
    """This rank has no more batches: until every rank has called join(), it
    takes part in the other ranks' collectives (contributing zeros to
    allreduce, so DistributedOptimizer's Average divides the others' sum by
    the number of ranks; no rows to allgather; receiving broadcasts), CUDA
    ones included: those run on ``device`` (default: the device of this
    rank's own CUDA collectives, else torch's current CUDA device once CUDA
    is in use). Returns the rank that called join() last, the same on every
    rank."""
    device = -1 if device is None else integer(device, "join's device")
    if device < 0 and torch.cuda.is_initialized():  # (never starts CUDA)
        device = torch.cuda.current_device()
    return _c.join(device=device)

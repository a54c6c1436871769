"""barrier and join on torch's side (join picks the CUDA device of this
rank's collectives)."""
from __future__ import annotations

import gc
import weakref

import torch

import commlib as _c
from commlib.checks import integer
from commlib.process_sets import check_process_set, global_process_set


def barrier(process_set=global_process_set) -> None:
    """Returns once every rank (of ``process_set``) has called barrier()."""
    _c.barrier(process_set=check_process_set(process_set))


# Objects whose collectives cannot run while a rank has joined, each with the
# reason join() refuses with (ZeRO: every rank's shard takes part in every step).
_join_refusers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def refuse_join(owner, why: str) -> None:
    """While ``owner`` lives, join() raises ValueError(why) on this rank."""
    _join_refusers[owner] = why


def join(device=-1) -> int:
    """This rank has no more batches: until every rank has called join(), it
    takes part in the other ranks' collectives (contributing zeros to
    allreduce, so DistributedOptimizer's Average divides the others' sum by
    the number of ranks; no rows to allgather; receiving broadcasts), CUDA
    ones included: those run on ``device`` (default: the device of this
    rank's own CUDA collectives, else torch's current CUDA device once CUDA
    is in use). Returns the rank that called join() last, the same on every
    rank. Refused (ValueError, before anything is sent) while a ZeRO
    optimizer (zero_stage > 0) lives on this rank."""
    if _join_refusers:
        gc.collect()  # (a refuser dropped but kept by a reference cycle refuses no more)
        for why in list(_join_refusers.values()):
            raise ValueError(why)
    device = -1 if device is None else integer(device, "join's device")
    if device < 0 and torch.cuda.is_initialized():  # (never starts CUDA)
        device = torch.cuda.current_device()
    return _c.join(device=device)

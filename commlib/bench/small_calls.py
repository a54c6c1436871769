"""The bench's small blocking calls through commlib.torch: one 4 KiB call of
each collective on the same named tensor again and again (as a training
loop's metrics and bookkeeping do), against the same call on numpy arrays
through mpi4py, measured interleaved in the same run."""
from __future__ import annotations

import importlib

import numpy as np

from .timing import interleaved_medians


def torch_calls_case(comm, nbytes: int = 4096, iters: int = 400):
    """``{op: (commlib.torch seconds, mpi4py seconds)}`` per call (medians,
    the slowest rank's) for allreduce (out of place), allgather, broadcast_
    (in place), alltoall and reducescatter of ``nbytes`` float32 per rank;
    None without torch."""
    try:
        import torch
    except ImportError:
        return None
    ct = importlib.import_module("commlib.torch")  # (by name: commlib/ imports no frontend)
    from mpi4py import MPI

    n = comm.Get_size()
    count = nbytes // 4 // n * n  # (divisible: alltoall and reducescatter split it evenly)
    t, x = torch.ones(count), np.ones(count, np.float32)
    gathered, part, y = np.empty(count * n, np.float32), np.empty(count // n, np.float32), np.empty_like(x)
    ours = {
        "allreduce": lambda: ct.allreduce(t, name="small.ar", op=ct.Sum),
        "allgather": lambda: ct.allgather(t, name="small.ag"),
        "broadcast_": lambda: ct.broadcast_(t, 0, name="small.bc"),
        "alltoall": lambda: ct.alltoall(t, name="small.a2a"),
        "reducescatter": lambda: ct.reducescatter(t, name="small.rs", op=ct.Sum),
    }
    theirs = {
        "allreduce": lambda: comm.Allreduce(x, y, op=MPI.SUM),
        "allgather": lambda: comm.Allgather(x, gathered),
        "broadcast_": lambda: comm.Bcast(x, root=0),
        "alltoall": lambda: comm.Alltoall(x, y),
        "reducescatter": lambda: comm.Reduce_scatter_block(x, part, op=MPI.SUM),
    }
    torch.set_num_threads(1)
    out = {}
    for op in ours:
        mine, mpi = interleaved_medians((ours[op], theirs[op]), iters, comm, per_round=20)
        out[op] = (mine, mpi)
    return out


def describe(result, nbytes: int = 4096) -> str:
    """The bench's line for torch_calls_case's result."""
    parts = [f"{op} {mine * 1e6:.1f}/{mpi * 1e6:.1f} us (ratio {mpi / mine:.2f})"
             for op, (mine, mpi) in result.items()]
    return (f"small calls, {nbytes // 1024} KiB through commlib.torch / mpi4py, each repeated under "
            "one name: " + ", ".join(parts))

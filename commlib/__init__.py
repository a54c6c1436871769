"""commlib: a framework-agnostic communication library for distributed
deep learning, in the tradition of Horovod.

    import commlib, numpy as np
    commlib.init()
    total = commlib.allreduce(np.ones(4) * commlib.rank(), op=commlib.Sum)

Launch N copies with ``commlibrun -np N python script.py`` (or mpirun).
"""
from .basics import (cross_rank, cross_size, init, is_initialized, local_rank, local_size,
                     mpi_library_version, mpi_threads_supported, rank, shutdown, size)
from .errors import CollectiveMismatchError, CommlibError, NotInitializedError, RankLostError
from .handle import Handle, poll, synchronize
from .ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async, allreduce,
                  allreduce_, allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier,
                  broadcast, broadcast_, broadcast_async, broadcast_async_, grouped_allreduce,
                  grouped_allreduce_async, reducescatter, reducescatter_async)

__version__ = "0.1.0"

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "mpi_threads_supported", "mpi_library_version",
    "CommlibError", "CollectiveMismatchError", "NotInitializedError", "RankLostError",
    "Handle", "poll", "synchronize",
    "Sum", "Average", "Min", "Max", "Product", "Adasum",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_async",
    "allgather", "allgather_async", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "barrier",
]

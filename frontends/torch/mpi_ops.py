"""Collectives on torch tensors, with Horovod's names, arguments and defaults.

CPU tensors are handed to the core without copies: ``tensor.numpy()`` shares
the tensor's memory, so in-place operations (``allreduce_``, ``broadcast_``,
...) write straight into the tensor, and out-of-place results are the core's
freshly allocated arrays wrapped with ``torch.from_numpy``. CUDA tensors work
in every collective: through NCCL when it loads (the core runs the collective
on its own stream after the caller's current stream, and ``synchronize``
makes that stream wait for the result), otherwise, or with
``COMMLIB_GPU_BACKEND=host``, staged through pinned host memory
(cuda_dispatch chooses). The tensors of one call must be on one device.

The out-of-place forms (``allreduce``, ``allgather``, ``broadcast``,
``alltoall``, ``reducescatter`` and the grouped forms) are differentiable
(torch.autograd.Function), with Horovod's gradients.

The framework-free parts, shared with commlib.tensorflow, come from commlib:
op resolution (``reduce_args``), process-set checks and sizes
(``process_sets``), generated names and broadcast's root check (``ops``),
Horovod's ``*_built`` queries (``capabilities``).

Process sets work as in horovod.torch: every collective takes
``process_set=`` (``global_process_set``, the default, or a ``ProcessSet``
registered on every rank with ``add_process_set`` or
``init(process_sets=[...])``). Only the set's members call a collective on
it (a non-member gets ValueError before anything is sent); Average divides
by the set's size, allgather/alltoall order rows by the set's ranks,
alltoall splits and reducescatter parts go to the set's members in order,
and ``root_rank`` is a job rank that belongs to the set. The gradients of
the differentiable collectives are collectives over the same set.

Differences from horovod.torch, all deliberate:

* CPU and CUDA tensors only: a tensor on another device (``mps``, ``meta``, ...)
  raises ValueError.
* ``synchronize`` on an already synchronized handle raises ValueError.
"""
from __future__ import annotations

import commlib as _c
from commlib import CommlibError  # noqa: F401 - re-exported
from commlib.basics import init, is_homogeneous  # noqa: F401 - re-exported
from commlib.capabilities import (  # noqa: F401 - re-exported
    ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, mpi_built, mpi_enabled,
    nccl_built, rocm_built)
from commlib.ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 - re-exported
from commlib.process_sets import (  # noqa: F401 - re-exported
    ProcessSet, add_process_set, check_process_set, global_process_set, remove_process_set)

# The collectives, one module per family; this module gathers Horovod's namespace.
from .collectives.control import barrier, join  # noqa: F401 - re-exported
from .collectives.allreduce_ops import (allreduce, allreduce_,  # noqa: F401
                                        allreduce_async, allreduce_async_, grouped_allreduce,
                                        grouped_allreduce_, grouped_allreduce_async,
                                        grouped_allreduce_async_)
from .collectives.gather_ops import (allgather, allgather_async, alltoall, alltoall_async,  # noqa: F401
                                     broadcast, broadcast_, broadcast_async, broadcast_async_,
                                     grouped_allgather, grouped_allgather_async)
from .collectives.handles import Handle, poll, synchronize  # noqa: F401 - re-exported
from .collectives.reducescatter_ops import (grouped_reducescatter, grouped_reducescatter_async,  # noqa: F401
                                            reducescatter, reducescatter_async)
from .collectives.sparse_allreduce import sparse_allreduce_async  # noqa: F401 - re-exported
from .collectives.tensor_io import SUPPORTED_DTYPES, check_tensor  # noqa: F401 - re-exported

# ---------------------------------------------------------------- basics

shutdown = _c.shutdown
is_initialized = _c.is_initialized
size = _c.size
rank = _c.rank
local_size = _c.local_size
local_rank = _c.local_rank
cross_size = _c.cross_size
cross_rank = _c.cross_rank
mpi_threads_supported = _c.mpi_threads_supported


__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "is_homogeneous", "Sum", "Average", "Min", "Max", "Product", "Adasum",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "Handle", "poll",
    "synchronize",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "barrier", "join", "CommlibError",
    "sparse_allreduce_async",
]

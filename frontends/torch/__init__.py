"""commlib.torch: the PyTorch frontend, a drop-in for ``horovod.torch``.

    import commlib.torch as hvd          # instead of: import horovod.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ...

Launch with ``commlibrun -np 4 python train.py`` (or mpirun). CPU and CUDA
tensors: CUDA ones go through NCCL when it loads, else through pinned host
memory (``COMMLIB_GPU_BACKEND``).

Process sets work as in horovod.torch: ``hvd.init(process_sets=[...])`` or
``hvd.add_process_set([0, 2])`` (on every rank) registers a
``hvd.ProcessSet``; collectives, the object helpers and
``DistributedOptimizer`` take ``process_set=`` and then run over its members
only (Average divides by the set's size)::

    even = hvd.add_process_set([r for r in range(hvd.size()) if r % 2 == 0])
    opt = hvd.DistributedOptimizer(opt, named_parameters=..., process_set=even)
    if even.included():
        hvd.allreduce(t, process_set=even)

``op=Adasum`` (adaptive summation, floating-point tensors) in the allreduces;
``DistributedOptimizer(op=Adasum)`` steps locally and Adasum-reduces the
parameter deltas (commlib.torch.optim.adasum_optimizer).
Timelines: start_timeline/stop_timeline (see commlib.timeline). Elastic training is restart from the
last commit (``hvd.elastic``, see commlib.torch.elastic and ``commlibrun --restarts``).
"""
from .collectives.compression import Compression
from .collectives.state_sync import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                     broadcast_parameters)
from .mpi_ops import (Adasum, Average, CommlibError, Handle, Max, Min, Product, ProcessSet, Sum,
                      add_process_set, allgather, allgather_async, allreduce, allreduce_,
                      allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier,
                      broadcast, broadcast_, broadcast_async, broadcast_async_, ccl_built,
                      cross_rank, cross_size, cuda_built, ddl_built, global_process_set,
                      gloo_built, gloo_enabled, grouped_allgather, grouped_allgather_async,
                      grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                      grouped_allreduce_async_, grouped_reducescatter, grouped_reducescatter_async,
                      init, is_homogeneous, is_initialized, join, local_rank, local_size,
                      mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, poll, rank,
                      reducescatter, reducescatter_async, remove_process_set, rocm_built, shutdown,
                      size, sparse_allreduce_async, synchronize)
from .optim.distributed_optimizer import DistributedOptimizer
from .optim.memory import memory_report
from .sharding.fully_shard import full_parameters, fully_shard
from .sharding.zero_checkpoint import full_state_dict, load_sharded, save_sharded
from .collectives.p2p import gradient_tag, irecv, isend, recv, send, sendrecv
from commlib.parallel_grid import ParallelGrid
from .optim.local_sgd import LocalSGD
from .sync_batch_norm import SyncBatchNorm
from . import elastic  # hvd.elastic.TorchState, hvd.elastic.run
from .optim._dispatch import is_torch_optimizer
from commlib.dispatch import register_optimizer
from commlib.timeline import start_timeline, stop_timeline
from commlib.errors import (CollectiveMismatchError, HorovodInternalError, HostsUpdatedInterrupt,
                            NotInitializedError, RankLostError, ScalarTensorError)

# commlib.DistributedOptimizer(torch_optimizer, ...) comes here.
register_optimizer(__name__, is_torch_optimizer, DistributedOptimizer)

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built",
    "Sum", "Average", "Min", "Max", "Product", "Adasum", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set",
    "Handle", "poll", "synchronize",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "barrier", "join",
    "sparse_allreduce_async", "start_timeline", "stop_timeline",
    "Compression", "DistributedOptimizer", "SyncBatchNorm", "LocalSGD", "elastic",
    "memory_report", "save_sharded", "load_sharded", "full_state_dict", "fully_shard",
    "full_parameters",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "CommlibError", "CollectiveMismatchError", "NotInitializedError", "RankLostError",
    "ScalarTensorError", "HorovodInternalError", "HostsUpdatedInterrupt",
]
__all__ += ["send", "recv", "isend", "irecv", "sendrecv", "gradient_tag", "ParallelGrid"]

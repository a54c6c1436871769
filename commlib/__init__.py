"""commlib: a framework-agnostic communication library for distributed
deep learning, in the tradition of Horovod.

    import commlib, numpy as np
    commlib.init()
    total = commlib.allreduce(np.ones(4) * commlib.rank(), op=commlib.Sum)

Launch N copies with ``commlibrun -np N python script.py`` (or mpirun).

The public names load lazily (PEP 562): importing ``commlib`` alone starts
neither MPI nor the compiled core, so the launcher (``commlib.launch.launcher``) and
``commlibrun --check-build`` work even where the core cannot load.
"""
import importlib as _importlib
import os as _os

__version__ = "0.1.0"

# Frontends (commlib.torch, commlib.tensorflow) live in frontends/; an
# installed package maps them into commlib/, and in a source checkout this
# makes the same imports work.
_frontends = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "frontends")
if _os.path.isdir(_frontends):
    __path__.append(_frontends)

_EXPORTS = {
    "basics": ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
               "cross_rank", "cross_size", "mpi_threads_supported", "mpi_library_version",
               "response_cache_stats", "autotune_history", "engine_state"],
    "dispatch": ["DistributedOptimizer"],
    "errors": ["CommlibError", "CollectiveMismatchError", "NotInitializedError", "RankLostError",
               "ScalarTensorError", "CollectiveTimeoutError", "HorovodInternalError",
               "HostsUpdatedInterrupt"],
    "handle": ["Handle", "poll", "synchronize"],
    "p2p": ["send", "recv", "isend", "irecv", "sendrecv"],
    "pieces_ops": ["reducescatter_pieces", "reducescatter_pieces_async"],
    "timeline": ["start_timeline", "stop_timeline"],
    "process_sets": ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"],
    "grouped_ops": ["grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
                    "grouped_allreduce_async_"],
    "ops": ["Sum", "Average", "Min", "Max", "Product", "Adasum",
            "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "allgather",
            "allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
            "reducescatter", "reducescatter_async", "barrier", "join"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = list(_WHERE)


def __getattr__(name):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'commlib' has no attribute {name!r}")
    loaded = _importlib.import_module(f"{__name__}.{module}")
    # Later lookups skip __getattr__. All of the module's names at once (and no
    # module is named like a function it exports: importing a submodule binds
    # its name here).
    for each in _EXPORTS[module]:
        globals()[each] = getattr(loaded, each)
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(__all__))

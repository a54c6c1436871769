"""commlib.tensorflow: Horovod's ``horovod.tensorflow`` API on commlib.

A TF2 script written for Horovod runs after changing its import::

    import tensorflow as tf
    import commlib.tensorflow as hvd

    hvd.init()
    model, opt = make_model(), tf.keras.optimizers.SGD(0.01 * hvd.size())

    @tf.function
    def step(x, y, first):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)          # averaged gradients
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

and ``commlibrun -np 4 python train.py`` launches it. Keras users import
``commlib.tensorflow.keras`` (DistributedOptimizer, callbacks).

Collectives work eagerly and inside tf.function (see collectives for how names
and ordering are kept consistent across ranks). Process sets work as in
Horovod: ``hvd.init(process_sets=[hvd.ProcessSet([0, 2]), ...])`` or
``hvd.add_process_set([0, 2])`` (on every rank) registers a set; the
collectives, broadcast_variables, the object helpers,
DistributedGradientTape and DistributedOptimizer take ``process_set=`` and
then communicate among its members only. Elastic training is restart from
the last commit (``hvd.elastic``: commlib.tensorflow.elastic for loops of
one's own, commlib.tensorflow.keras.elastic for model.fit); timelines:
start_timeline/stop_timeline (commlib.timeline). ``op=Adasum`` (adaptive
summation, floating-point tensors) in the allreduces and DistributedOptimizer
reduces the gradients adaptively. Not available (yet): XLA-compiled functions.
"""
from commlib.basics import (cross_rank, cross_size, is_initialized, local_rank, local_size,
                            mpi_threads_supported, rank, shutdown, size)
from commlib.basics import init, is_homogeneous
from commlib.capabilities import (ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled,
                                  mpi_built, mpi_enabled, nccl_built, rocm_built)
from commlib.dispatch import register_optimizer
from commlib.timeline import start_timeline, stop_timeline
from commlib.errors import (CollectiveMismatchError, CommlibError, HorovodInternalError,
                            HostsUpdatedInterrupt, NotInitializedError, RankLostError,
                            ScalarTensorError)
from commlib.grouping import resolve_groups
from commlib.ops import Average, Max, Min, Product, Sum
from commlib.process_sets import (ProcessSet, add_process_set, check_process_set,
                                  remove_process_set)
from commlib.reduce_args import predivide_scales, resolve_op

from ._dispatch import is_keras_optimizer, is_tf_legacy_optimizer, is_tf_optimizer
from .compression import Compression
from .execution import communication_stats
from .collectives.state_sync import allgather_object, broadcast_object, broadcast_object_fn, broadcast_variables
from .delayed_tape import DelayedGradients
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from .p2p import gradient_tag, recv, send
from .mpi_ops import (Adasum, allgather, allreduce, alltoall, barrier, broadcast, broadcast_,
                      global_process_set, grouped_allgather, grouped_allreduce,
                      grouped_reducescatter, join, local_rank_op, local_size_op,
                      process_set_included_op, rank_op, reducescatter, size_op)

import tensorflow as tf  # noqa: E402


def __getattr__(name):
    # Keras-dependent names load on first use: importing commlib.tensorflow
    # does not import Keras.
    if name == "SyncBatchNormalization":
        from .sync_batch_norm import SyncBatchNormalization

        return SyncBatchNormalization
    if name in ("keras", "elastic"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def broadcast_global_variables(root_rank):
    """TF1 graph mode only (as in Horovod): broadcasts tf.compat.v1 global
    variables. In TF2 use broadcast_variables(model.variables, root_rank)."""
    if tf.executing_eagerly():
        raise RuntimeError("broadcast_global_variables() does not support eager execution. "
                           "Please use `broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """TF1 SessionRunHook broadcasting all global variables from root_rank
    once the session is created."""

    def __init__(self, root_rank, device=''):
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None
        self.device = device

    def begin(self):
        if not self.bcast_op or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps a TF1 ``tf.compat.v1.train.Optimizer``: compute_gradients()
    returns gradients averaged across ranks."""

    def __init__(self, optimizer, name=None, use_locking=False, device_dense='',
                 device_sparse='', compression=Compression.none, sparse_as_dense=False,
                 op=Average, gradient_predivide_factor=1.0, groups=None, process_set=None,
                 scale_local_gradients=True):
        from .gradient_tape import make_allreduce_grads

        if name is None:
            name = f"Distributed{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._allreduce_grads = make_allreduce_grads(device_dense, device_sparse, compression,
                                                     sparse_as_dense, op,
                                                     gradient_predivide_factor, groups,
                                                     process_set, name)
        self._local_vars = set()
        self.scale_local_gradients = scale_local_gradients

    def register_local_var(self, var):
        from .gradient_tape import var_key

        self._local_vars.add(var_key(var))

    def compute_gradients(self, *args, **kwargs):
        from .gradient_tape import scale_local, var_key

        gradients = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = zip(*gradients) if gradients else ((), ())
        shared = [i for i, v in enumerate(variables) if var_key(v) not in self._local_vars]
        reduced = self._allreduce_grads([grads[i] for i in shared],
                                        [variables[i] for i in shared])
        out = list(grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        if self._local_vars and self.scale_local_gradients:
            n = self._allreduce_grads.local_divisor
            for i, v in enumerate(variables):
                if var_key(v) in self._local_vars:
                    out[i] = scale_local(out[i], n)
        return list(zip(out, variables))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense='',
                         device_sparse='', compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True, **keras_options):
    """Wraps a Keras optimizer (see commlib.tensorflow.keras.DistributedOptimizer)
    or a TF1 ``tf.compat.v1.train.Optimizer`` so that gradients are averaged
    across ranks before they are applied. ``keras_options``: the Keras
    wrapper's own options (staleness, weight_prediction, zero_stage,
    bucket_elements, local_layers), for Keras optimizers only."""
    process_set = check_process_set(process_set, member=False)
    op = resolve_op(op)
    predivide_scales(op, gradient_predivide_factor)
    groups = resolve_groups(num_groups, groups)
    if is_keras_optimizer(optimizer):
        from . import keras as _keras

        return _keras.DistributedOptimizer(
            optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
            compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients,
            **keras_options)
    if is_tf_legacy_optimizer(optimizer):
        if keras_options:
            raise ValueError(f"{', '.join(sorted(keras_options))}: options of Keras optimizers "
                             f"only, not of a TF1 optimizer")
        if backward_passes_per_step != 1:
            raise NotImplementedError("backward_passes_per_step > 1 is only supported for Keras "
                                      "optimizers")
        return _DistributedOptimizer(optimizer, name, use_locking, device_dense, device_sparse,
                                     compression, sparse_as_dense, op, gradient_predivide_factor,
                                     groups, process_set, scale_local_gradients)
    raise ValueError("Provided optimizer doesn't inherit from either legacy TensorFlow or Keras "
                     f"optimizer: {optimizer}")


# commlib.DistributedOptimizer(keras_or_tf1_optimizer, ...) comes here.
register_optimizer(__name__, is_tf_optimizer, DistributedOptimizer)

__all__ = [
    "init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank",
    "local_rank", "cross_rank", "is_homogeneous", "mpi_threads_supported", "mpi_enabled",
    "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built",
    "cuda_built", "rocm_built", "rank_op", "local_rank_op", "size_op", "local_size_op",
    "process_set_included_op", "Average", "Sum", "Min", "Max", "Product", "Adasum",
    "Compression", "allreduce", "grouped_allreduce", "allgather", "grouped_allgather",
    "broadcast", "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter", "barrier",
    "join", "broadcast_variables", "broadcast_object", "broadcast_object_fn", "allgather_object",
    "broadcast_global_variables", "BroadcastGlobalVariablesHook", "DistributedOptimizer",
    "DistributedGradientTape", "PartialDistributedGradientTape", "SyncBatchNormalization",
    "ProcessSet", "DelayedGradients",
    "global_process_set", "add_process_set", "remove_process_set", "start_timeline",
    "stop_timeline", "communication_stats", "CommlibError", "CollectiveMismatchError",
    "NotInitializedError", "RankLostError", "ScalarTensorError", "HorovodInternalError",
    "HostsUpdatedInterrupt",
]
__all__ += ["send", "recv", "gradient_tag"]

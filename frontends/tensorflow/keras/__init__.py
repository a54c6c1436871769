"""commlib.tensorflow.keras: Horovod's ``horovod.tensorflow.keras`` on commlib,
for Keras 3 with the TensorFlow backend::

    import keras
    import commlib.tensorflow.keras as hvd

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()],
              verbose=1 if hvd.rank() == 0 else 0)

``DistributedOptimizer`` returns an instance of a subclass of the wrapped
optimizer's class whose ``apply``/``apply_gradients`` first averages the
gradients across ranks (one grouped allreduce; inside the compiled train step
it is a tf.function-safe op). With ``backward_passes_per_step=k`` gradients
are accumulated locally and reduced and applied every k-th step (the
optimizer's ``iterations`` still counts every step, as in Horovod).

``DistributedOptimizer(..., process_set=ps)`` averages gradients over the
members of a registered ProcessSet only (Average divides by the set's size);
on ranks outside the set it applies local gradients, as in Horovod.

Models must be compiled with ``jit_compile=False`` when XLA would otherwise be
used (Keras enables it automatically only on GPUs).
"""
from __future__ import annotations

import functools
import warnings

import keras
import tensorflow as tf

from commlib.basics import (cross_rank, cross_size, init, is_homogeneous,  # noqa: F401
                            is_initialized, local_rank, local_size, mpi_threads_supported, rank,
                            shutdown, size)
from commlib.checks import positive_count
from commlib.delayed import check_staleness as _check_staleness
from commlib.delayed import check_weight_prediction as _check_weight_prediction
from commlib.errors import (CollectiveMismatchError, CommlibError,  # noqa: F401
                            NotInitializedError, RankLostError)
from commlib.grouping import resolve_groups
from commlib.ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401
from commlib.process_sets import (ProcessSet, add_process_set,  # noqa: F401
                                  check_process_set, global_process_set, remove_process_set)
from commlib.reduce_args import predivide_scales, resolve_op

from ..compression import Compression
from ..execution import communication_stats  # noqa: F401
from ..collectives.state_sync import allgather_object, broadcast_object, broadcast_variables  # noqa: F401
from .. import mpi_ops as _ops
from ..gradient_tape import make_allreduce_grads
from ..sync_batch_norm import SyncBatchNormalization  # noqa: F401
from . import callbacks  # noqa: F401
from .optimizer_base import DistributedOptimizerMixin as _DistributedOptimizerMixin
from .optimizer_base import check_backend as _check_backend
from .local_sgd import LocalSGD  # noqa: F401,E402
from . import elastic  # noqa: F401 - hvd.elastic.KerasState, hvd.elastic.run
from .memory import memory_report  # noqa: F401,E402
from .powersgd import powersgd_allreduce
from .zero_checkpoint import load_sharded, save_sharded  # noqa: F401,E402


@functools.lru_cache(maxsize=None)
def _distributed_class(base, staleness=0, zero=False, powersgd=False):
    # Same name and module as the wrapped class: a saved model records the
    # plain optimizer (load_model below wraps it again).
    if powersgd:
        from .powersgd import PowerSGDOptimizerMixin as mixin
    elif zero:
        from .zero import ZeroOptimizerMixin as mixin
    elif staleness:
        from .delayed import DelayedOptimizerMixin as mixin
    else:
        mixin = _DistributedOptimizerMixin
    return type(base.__name__, (mixin, base),
                {"__module__": base.__module__, "__qualname__": base.__qualname__})


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=None, scale_local_gradients=True, local_layers=None,
                         staleness=0, zero_stage=0, bucket_elements=None,
                         weight_prediction=False):
    """A copy of the Keras ``optimizer`` that averages (``op``) gradients across
    ranks (of ``process_set``; on ranks outside it, gradients stay local)
    before applying them. ``op=Adasum`` combines them adaptively instead, as
    Horovod's Keras optimizer does (do not scale the learning rate by size).

    local_layers: a Keras layer or a list of them whose gradients stay local
    (Horovod's partial distributed optimizer; their weights may differ across
    ranks); scaled by 1/size of the set when scale_local_gradients.

    compression: Compression.fp16 sends float gradients as float16;
    Compression.powersgd(rank=2, ...) low-rank with error feedback (see
    commlib.tensorflow.keras.powersgd).
    sparse_as_dense: densify IndexedSlices gradients (embeddings) instead of
    allgathering their values and indices. gradient_predivide_factor f: scale
    by 1/f before the sum and f/size after (op Average only).
    backward_passes_per_step k: accumulate k steps locally, then reduce and
    apply (summed, or averaged when average_aggregated_gradients).
    groups: an int or lists of variables, to split the gradients into several
    grouped allreduces. If ``optimizer`` has been used already its state
    (slots, iterations) is copied.
    staleness: 0 (synchronous) or 1: one-step delayed averaging, each step
    applies the previous step's average while this one's travels (see
    "Details and limits" below; ``synchronize()`` applies the last one).
    weight_prediction: with staleness=1, compute the gradients at the
    predicted weights w + (w - w_prev) that they will be applied to (opt-in;
    see commlib.tensorflow.keras.weight_prediction).
    zero_stage: 0 (every rank holds the whole optimizer state), 1 or 2: ZeRO,
    each rank keeps the state of 1/size of the elements (flat buckets of at
    most ``bucket_elements``); both stages reduce-scatter the gradients and
    behave the same in Keras (see commlib.tensorflow.keras.zero).

    Details and limits:
    - Used in ``model.compile``/``model.fit`` or ``opt.apply(grads, vars)``
      in a custom loop, eagerly or in tf.function (not XLA: it raises).
    - backward_passes_per_step's accumulators and weight prediction's copies
      are variables of their own, outside ``opt.variables``: a saved model's
      optimizer state is the wrapped optimizer's, and ``hvd.load_model``
      restores it.
    - staleness=1: step t starts averaging its gradients and applies step
      t-1's average (step 0 applies nothing); ``opt.synchronize()`` applies
      the pending one (eagerly: after fit(), before evaluating or saving).
      Compression.fp16 gradients travel and wait as float16. With
      backward_passes_per_step=k every k-th step swaps the aggregate for the
      previous one's average (the other steps only count in ``iterations``;
      the first k-th step applies nothing). IndexedSlices are averaged
      dense; the variables with a gradient must be the same at every step
      and on every rank. Not with groups or local_layers, nor
      weight_prediction with backward_passes_per_step > 1. A rank lost while
      an average is in flight makes the next step raise RankLostError (also
      a tf.errors.AbortedError).
    - zero_stage=1|2: element-wise optimizers only (Lamb, Adafactor, Muon
      are refused); not with clipnorm/global_clipnorm, EMA,
      gradient_accumulation_steps, backward_passes_per_step, staleness,
      groups, local_layers, compression, process sets or a
      LossScaleOptimizer. The shard optimizer's state is not in
      ``opt.variables``: checkpoint with ``hvd.save_sharded(dir, model,
      opt)`` and ``hvd.load_sharded(dir, model, opt)`` (any world size, stage
      or bucket size); ``hvd.memory_report(model, opt)`` gives the bytes
      held. Ranks whose variables differ raise CollectiveMismatchError at
      the first step.
    - ``commlib.DistributedOptimizer(opt)`` dispatches Keras optimizers here.
    """
    _check_backend()
    if isinstance(optimizer, _DistributedOptimizerMixin):
        raise ValueError("optimizer is already a commlib DistributedOptimizer")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"expected a Keras optimizer, got {type(optimizer).__name__}")
    process_set = check_process_set(process_set, member=False)
    op = resolve_op(op)
    if op == Adasum and (staleness != 0 or zero_stage != 0):
        raise ValueError("op=Adasum cannot be combined with staleness or zero_stage")
    groups = resolve_groups(num_groups, groups)
    backward_passes_per_step = positive_count(backward_passes_per_step, "backward_passes_per_step")
    if (keras.mixed_precision.global_policy().name == "mixed_float16"
            and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
        # compile() would wrap us in a LossScaleOptimizer whose local
        # overflow check could skip the allreduce on some ranks only; put the
        # loss scaling inside instead, so every rank sees the same gradients.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    name_ = name or f"Distributed{type(optimizer).__name__}"
    powersgd = powersgd_allreduce(compression, op, gradient_predivide_factor, process_set,
                                  sparse_as_dense, name_, staleness, zero_stage, groups)
    allreduce_grads = powersgd or make_allreduce_grads(
        device_dense, device_sparse, compression, sparse_as_dense, op, gradient_predivide_factor,
        groups, process_set, name=name_)
    if staleness != 0:
        _check_staleness(staleness, refused={
            "groups": groups is not None, "local_layers": bool(local_layers),
            "weight_prediction with backward_passes_per_step > 1":
                weight_prediction is True and int(backward_passes_per_step) > 1})
    _check_weight_prediction(weight_prediction, staleness)
    if zero_stage != 0:
        from .zero import check_zero_options

        bucket_elements = check_zero_options(
            optimizer, zero_stage, bucket_elements, op=op,
            backward_passes_per_step=backward_passes_per_step, staleness=staleness,
            groups=groups, local_layers=local_layers, compression=compression,
            process_set=process_set)
    cls = _distributed_class(type(optimizer), staleness, zero_stage != 0, powersgd is not None)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    new = cls.from_config(config)
    new.commlib_setup(allreduce_grads, backward_passes_per_step, average_aggregated_gradients,
                      scale_local_gradients)
    if staleness:
        new.commlib_delayed_setup(op, gradient_predivide_factor, process_set, weight_prediction,
                                  compression)
    if zero_stage != 0:
        new.commlib_zero_setup(type(optimizer), zero_stage, bucket_elements, op,
                               *predivide_scales(op, gradient_predivide_factor))
    if getattr(optimizer, "built", False):
        _copy_state(optimizer, new)
    for layer in _as_layer_list(local_layers):
        for v in layer.trainable_weights:
            new.register_local_var(v)
    return new


def _as_layer_list(local_layers) -> list:
    if local_layers is None:
        return []
    layers = list(local_layers) if isinstance(local_layers, (list, tuple)) else [local_layers]
    for layer in layers:
        if not isinstance(layer, keras.layers.Layer):
            raise ValueError(f"local_layers must be Keras layers, got {type(layer).__name__}")
    return layers


def _copy_state(old, new):
    variables = list(getattr(old, "_trainable_variables", []))
    with keras.name_scope(new.name, caller=new):
        new.build(variables)
    new.built = True
    for nv, ov in zip(new.variables, old.variables):
        if tuple(nv.shape) == tuple(ov.shape):
            nv.assign(ov)


def PartialDistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=None, local_layers=None,
                                scale_local_gradients=True):
    """DistributedOptimizer whose ``local_layers`` keep their gradients local
    (Horovod's name for ``DistributedOptimizer(..., local_layers=...)``)."""
    return DistributedOptimizer(optimizer, name, device_dense, device_sparse, compression,
                                sparse_as_dense, gradient_predivide_factor, op,
                                backward_passes_per_step, average_aggregated_gradients,
                                groups=groups, process_set=process_set,
                                scale_local_gradients=scale_local_gradients,
                                local_layers=local_layers)


def broadcast_global_variables(root_rank):
    """Not available in TF2/Keras 3 (as in Horovod under eager execution)."""
    raise RuntimeError("broadcast_global_variables() does not support eager execution. Use "
                       "broadcast_variables(model.variables, root_rank) or "
                       "callbacks.BroadcastGlobalVariablesCallback(root_rank) instead.")


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none, process_set=global_process_set):
    """The reduction (default Average) of a tensor-compatible value across
    ranks (of ``process_set``, a commlib extension of Horovod's signature)."""
    return _ops.allreduce(tf.convert_to_tensor(value), average=average, name=name, op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          compression=compression, process_set=process_set)


def allgather(value, name=None, process_set=global_process_set):
    return _ops.allgather(tf.convert_to_tensor(value), name=name, process_set=process_set)


def broadcast(value, root_rank, name=None, process_set=global_process_set):
    return _ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name,
                          process_set=process_set)


def reducescatter(value, name=None, op=Average, process_set=global_process_set):
    return _ops.reducescatter(tf.convert_to_tensor(value), name=name, op=op,
                              process_set=process_set)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """keras.models.load_model, with the model's optimizer (and its restored
    state) wrapped in DistributedOptimizer. A ``.keras`` file saved with
    ``compression=Compression.powersgd(...)`` comes back with it, its
    configuration and state (error buffers, Q, exchange step) restored:
    ``compression`` left as none takes the saved configuration; another
    PowerSGD configuration raises ValueError; another compressor keeps the
    wrapped optimizer's state and drops PowerSGD's (a warning)."""
    from .powersgd import load_saved_state, saved_config, saved_state

    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects.setdefault(cls.__name__, cls)
    state = saved_state(filepath)
    with warnings.catch_warnings():
        if state is not None:  # (the plain optimizer skips the state; loaded below)
            warnings.filterwarnings("ignore", "Skipping variable loading for optimizer")
        model = keras.models.load_model(filepath, custom_objects=objects or None)
    opt = getattr(model, "optimizer", None)
    if opt is not None and not isinstance(opt, _DistributedOptimizerMixin):
        if state is not None and compression is Compression.none:
            compression = saved_config(state)
        model.optimizer = DistributedOptimizer(opt, compression=compression)
        if state is not None:
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
            load_saved_state(model.optimizer, state)
    return model

"""Averaging gradients across ranks: the shared ``make_allreduce_grads`` (used
by DistributedGradientTape, the Keras DistributedOptimizer and the TF1
optimizer wrapper) and ``DistributedGradientTape`` itself::

    with tf.GradientTape() as tape:
        loss = loss_fn(model(x), y)
    tape = commlib.tensorflow.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)   # averaged over ranks

Dense gradients go out as one grouped allreduce (negotiated together and
fused by the core), or as one per group when ``groups`` is given;
IndexedSlices are allgathered (values and indices) unless ``sparse_as_dense``.

With ``process_set`` (as in Horovod) gradients are reduced over the set's
members only (Average divides by the set's size); every rank may build the
tape or optimizer, and ranks outside the set keep their local gradients
(no communication).
"""
from __future__ import annotations

import functools

import tensorflow as tf

import commlib
from commlib.checks import compressor
from commlib.delayed import check_tape_options
from commlib.grouping import group_indices, resolve_groups
from commlib.ops import Average
from commlib.process_sets import check_process_set, included, set_size
from commlib.reduce_args import predivide_scales, resolve_op

from . import mpi_ops
from .compression import Compression
from .variables import var_key  # noqa: F401 (commlib.tensorflow uses it from here)
from .delayed_tape import DelayedGradients, DelayedTapeMixin
from .execution import check_dtype
from .powersgd import as_config as as_powersgd
from .powersgd_exchange import tape_reducer


def make_allreduce_grads(device_dense='', device_sparse='', compression=Compression.none,
                         sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0,
                         groups=None, process_set=None, name="DistributedGradientTape"):
    """``allreduce_grads(grads, variables) -> grads`` reduced across ranks (of
    ``process_set``; None gradients stay None). On a rank outside the set the
    gradients are returned unreduced. ``allreduce_grads.local_divisor`` is
    what local gradients are divided by when scale_local_gradients."""
    process_set = check_process_set(process_set, member=False)
    op = resolve_op(op)
    pre, post = predivide_scales(op, gradient_predivide_factor)
    compressor(compression)
    member = included(process_set)
    n = set_size(process_set)

    def allreduce_grads(grads, variables=None):
        grads = list(grads)
        if not member or (n == 1 and pre * post == 1.0):
            return [tf.convert_to_tensor(g) if sparse_as_dense and isinstance(g, tf.IndexedSlices)
                    else g for g in grads]
        if sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        out = list(grads)
        dense = [i for i, g in enumerate(grads)
                 if g is not None and not isinstance(g, tf.IndexedSlices)]
        sparse = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
        with tf.name_scope(name + "_Allreduce"):
            keys = (lambda i: var_key(variables[i])) if variables is not None else (lambda i: i)
            for group in group_indices(dense, groups, keys, var_key):
                ts = [tf.convert_to_tensor(grads[i]) for i in group]
                for t in ts:
                    check_dtype(t.dtype, "allreduce of gradients", op=op)
                packed = [compression.compress(t) for t in ts]
                reduced = mpi_ops.grouped_allreduce_raw([c for c, _ in packed], op, pre, post,
                                                         process_set=process_set)
                for i, r, (_, ctx) in zip(group, reduced, packed):
                    out[i] = compression.decompress(r, ctx)
            for i in sparse:
                if op not in (commlib.Sum, commlib.Average):
                    raise NotImplementedError("Only Sum and Average ops are supported with "
                                              "tf.IndexedSlices")
                out[i] = mpi_ops.allreduce_sparse(grads[i], op, pre * post, None, False,
                                                   process_set)
        return out

    allreduce_grads.process_set = process_set
    allreduce_grads.local_divisor = n if member else 1
    return allreduce_grads


def reduce_shared(allreduce_grads, grads, variables, local, scale_local_grads):
    """``grads`` with those of the variables not in ``local`` (var_key()s)
    reduced by ``allreduce_grads``; the local ones divided by its
    local_divisor when scale_local_grads."""
    shared = [i for i, v in enumerate(variables) if var_key(v) not in local]
    reduced = allreduce_grads([grads[i] for i in shared], [variables[i] for i in shared])
    out = list(grads)
    for i, g in zip(shared, reduced):
        out[i] = g
    if local and scale_local_grads:
        n = allreduce_grads.local_divisor
        for i, v in enumerate(variables):
            if var_key(v) in local:
                out[i] = scale_local(out[i], n)
    return out


def scale_local(grad, n):
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(n, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad / tf.cast(n, grad.dtype)


class _DistributedGradientTapeMixin:
    """Put in front of the wrapped tape's class: gradient() reduces."""

    def register_local_source(self, source):
        """Gradients of ``source`` stay local (not reduced; divided by the
        process set's size when scale_local_gradients)."""
        self._commlib_local.add(var_key(source))

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients=output_gradients,
                                 unconnected_gradients=unconnected_gradients)
        out = reduce_shared(self._commlib_allreduce, tf.nest.flatten(grads), tf.nest.flatten(sources),
                            self._commlib_local, self._commlib_scale_local)
        return tf.nest.pack_sequence_as(grads, out)


@functools.lru_cache(maxsize=None)
def _tape_class(base, mixin=_DistributedGradientTapeMixin):
    return type(base.__name__, (mixin, base), {"__module__": __name__})


def DistributedGradientTape(gradtape, device_dense='', device_sparse='',
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=None, scale_local_gradients=True, staleness=0,
                            delayed=None):
    """A tape that shares ``gradtape``'s recording and averages (``op``) the
    gradients it returns across ranks (of ``process_set``: its members only;
    on other ranks the gradients stay local).

    gradient_predivide_factor f (op Average only) scales by 1/f before the
    sum and f/size after it; groups (an int, or lists of variables) splits
    the gradients into that many grouped allreduces; compression
    (Compression.fp16) halves the bytes sent for float32 gradients;
    Compression.powersgd(...) (one object, passed to every step's tape: it
    holds the state) sends low-rank factors (see commlib.tensorflow.powersgd).

    staleness=1 with ``delayed=DelayedGradients(...)`` (created once, before
    the training loop; it takes op, predivide factor and process set):
    gradient() starts averaging this step's gradients and returns the
    previous step's average (see DelayedGradients).
    """
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
    groups = resolve_groups(num_groups, groups)
    check_tape_options(staleness, delayed, groups, DelayedGradients)
    mixin = DelayedTapeMixin if staleness else _DistributedGradientTapeMixin
    cls = _tape_class(type(gradtape), mixin)
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    if "_recording" in tape.__dict__:
        tape._recording = False  # the original owns the recording context
    if as_powersgd(compression) is not None:
        tape._commlib_allreduce = tape_reducer(compression, resolve_op(op), *predivide_scales(
            resolve_op(op), gradient_predivide_factor), process_set, sparse_as_dense, staleness,
            groups)
    else:
        tape._commlib_allreduce = make_allreduce_grads(
            device_dense, device_sparse, compression, sparse_as_dense, op,
            gradient_predivide_factor, groups, process_set)
    tape._commlib_local = set()
    tape._commlib_scale_local = scale_local_gradients
    tape._commlib_delayed = delayed
    tape._commlib_compression = compression
    return tape


def PartialDistributedGradientTape(gradtape, device_dense='', device_sparse='',
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=None, local_layers=None,
                                   scale_local_gradients=True):
    """DistributedGradientTape whose ``local_layers`` (Keras layers) keep
    their gradients local."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    for layer in local_layers:
        if not hasattr(layer, "trainable_weights"):
            raise ValueError("All local layers must be Keras layers")
        for v in layer.trainable_weights:
            tape.register_local_source(v)
    return tape

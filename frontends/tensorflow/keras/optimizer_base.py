"""The Keras DistributedOptimizer's machinery, shared by the plain, delayed
(delayed.py) and local-SGD (local_sgd.py) optimizers: the backend check,
commlib's own state variables and the mixin placed in front of the wrapped
optimizer's class."""
from __future__ import annotations

import functools

import keras
import tensorflow as tf

from ..delayed_tape import build_outside_cond
from ..gradient_tape import reduce_shared, var_key


def check_backend():
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ValueError(f"commlib.tensorflow.keras needs the Keras TensorFlow backend, Keras is "
                         f"using {backend!r}; set KERAS_BACKEND=tensorflow (for PyTorch use "
                         f"commlib.torch)")


def run_if(pred, fn, otherwise=None) -> None:
    """``fn()`` when ``pred`` (a Python or tensor bool) holds, else
    ``otherwise()`` if given: in Python eagerly, as tf.cond in a graph."""
    if tf.executing_eagerly():
        chosen = fn if bool(pred) else otherwise
        if chosen is not None:
            chosen()
        return

    def branch(f, result):
        def run():
            if f is not None:
                f()
            return tf.constant(result)
        return run

    tf.cond(pred, branch(fn, True), branch(otherwise, False))


def run_after(deps, fn) -> None:
    """``fn()``, in a graph once the tensors ``deps`` are computed (a
    variable's update is not ordered after an unrelated op otherwise)."""
    deps = [d for d in deps if tf.is_tensor(d)]
    if tf.executing_eagerly() or not deps:
        fn()
        return
    with tf.control_dependencies(deps):
        fn()


def own_zeros_like(references, name: str) -> list:
    """Zero variables shaped like ``references`` for commlib's state beside
    an optimizer (accumulators, weight prediction's copies, LocalSGD's
    anchor): variables of their own, not the optimizer's, so its saved state
    stays the wrapped optimizer's, which a plain one loads whole (Keras skips
    all of it on a count mismatch). Created eagerly: ``build`` runs inside
    the first traced train step."""
    with tf.init_scope():
        return [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=name)
                for v in references]


def own_counter(name: str):
    """An int64 counter at 0, beside an optimizer as ``own_zeros_like``'s."""
    with tf.init_scope():
        return tf.Variable(0, dtype=tf.int64, trainable=False, name=name)


class DistributedOptimizerMixin:
    """Placed in front of the wrapped optimizer's class in the MRO."""

    def commlib_setup(self, allreduce_grads, backward_passes_per_step,
                      average_aggregated_gradients, scale_local_gradients):
        """Called once by DistributedOptimizer on the new optimizer.
        ``commlib_accumulators``: the gradient accumulators (built with the
        optimizer when backward_passes_per_step > 1, else None)."""
        # object.__setattr__: plain attributes, outside Keras/TF tracking
        s = functools.partial(object.__setattr__, self)
        s("_commlib_allreduce", allreduce_grads)
        s("_commlib_bpps", int(backward_passes_per_step))
        s("_commlib_avg_agg", bool(average_aggregated_gradients))
        s("_commlib_scale_local", bool(scale_local_gradients))
        s("_commlib_local", set())
        s("commlib_accumulators", None)
        s("_commlib_counter", None)

    def register_local_var(self, var):
        """Gradients of ``var`` stay local (not reduced; divided by the
        process set's size when scale_local_gradients)."""
        self._commlib_local.add(var_key(var))

    def build(self, variables):
        super().build(variables)
        if getattr(self, "_commlib_bpps", 1) > 1 and self.commlib_accumulators is None:
            # (Not in the saved state: a checkpoint taken between updates
            # drops the partial sum, as Horovod's does.)
            object.__setattr__(self, "commlib_accumulators",
                               own_zeros_like(variables, "commlib_accumulator"))
            object.__setattr__(self, "_commlib_counter", own_counter("commlib_backward_passes"))

    def _commlib_reduce(self, grads, variables):
        return reduce_shared(self._commlib_allreduce, list(grads), variables, self._commlib_local,
                             self._commlib_scale_local)

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if not grads:
            return super().apply(grads, trainable_variables)
        if trainable_variables is None:
            if not self.built:
                return super().apply(grads, None)  # raises Keras' own error
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
        if self._commlib_bpps == 1:
            return self._commlib_apply_aggregate(grads, variables)
        return self._commlib_accumulate_apply(grads, variables)

    def _commlib_apply_aggregate(self, grads, variables):
        """Reduces the gradients of an update and applies them."""
        return super().apply(self._commlib_reduce(grads, variables), variables)

    def _commlib_accumulate_apply(self, grads, variables):
        build_outside_cond(self, variables)
        k = self._commlib_bpps
        acc = [self.commlib_accumulators[self._get_variable_index(v)] for v in variables]
        for g, a in zip(grads, acc):
            if g is not None:
                self.assign_add(a, g)
        self._commlib_counter.assign_add(1)
        is_update = tf.equal(tf.math.floormod(tf.convert_to_tensor(self._commlib_counter), k), 0)
        present = [g is not None for g in grads]

        def update():
            agg = [tf.convert_to_tensor(a) if p else None for a, p in zip(acc, present)]
            if self._commlib_avg_agg:
                agg = [None if a is None else a / tf.cast(k, a.dtype) for a in agg]
            self._commlib_apply_aggregate(agg, variables)
            for a in acc:
                a.assign(tf.zeros_like(a))

        run_if(is_update, update, lambda: self._iterations.assign_add(1))

"""The Keras DistributedOptimizer's machinery, shared by the plain, delayed
(delayed.py) and local-SGD (local_sgd.py) optimizers: the backend check and
the mixin placed in front of the wrapped optimizer's class."""
from __future__ import annotations

import functools

import keras
import tensorflow as tf

from ..gradient_tape import reduce_shared, var_key


def check_backend():
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ValueError(f"commlib.tensorflow.keras needs the Keras TensorFlow backend, Keras is "
                         f"using {backend!r}; set KERAS_BACKEND=tensorflow (for PyTorch use "
                         f"commlib.torch)")


class DistributedOptimizerMixin:
    """Placed in front of the wrapped optimizer's class in the MRO."""

    def _commlib_setup(self, allreduce_grads, backward_passes_per_step,
                       average_aggregated_gradients, scale_local_gradients):
        # object.__setattr__: plain attributes, outside Keras/TF tracking
        s = functools.partial(object.__setattr__, self)
        s("_commlib_allreduce", allreduce_grads)
        s("_commlib_bpps", int(backward_passes_per_step))
        s("_commlib_avg_agg", bool(average_aggregated_gradients))
        s("_commlib_scale_local", bool(scale_local_gradients))
        s("_commlib_local", set())
        s("_commlib_acc", None)
        s("_commlib_counter", None)

    def register_local_var(self, var):
        """Gradients of ``var`` stay local (not reduced; divided by the
        process set's size when scale_local_gradients)."""
        self._commlib_local.add(var_key(var))

    def build(self, variables):
        super().build(variables)
        if getattr(self, "_commlib_bpps", 1) > 1 and self._commlib_acc is None:
            # Variables of their own, not the optimizer's: its saved state
            # stays the wrapped optimizer's, which a plain one loads whole
            # (Keras skips all of it on a count mismatch). A checkpoint taken
            # between updates drops the partial sum, as Horovod's does.
            with tf.init_scope():  # (built inside the first traced train step)
                acc = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                   name="commlib_accumulator") for v in variables]
                counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                      name="commlib_backward_passes")
            object.__setattr__(self, "_commlib_acc", acc)
            object.__setattr__(self, "_commlib_counter", counter)

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
            return super().apply(self._commlib_reduce(grads, variables), trainable_variables)
        return self._commlib_accumulate_apply(grads, variables)

    def _commlib_accumulate_apply(self, grads, variables):
        if not self.built:
            with keras.name_scope(self.name, caller=self):
                self.build(variables)
            self.built = True
        k = self._commlib_bpps
        acc = [self._commlib_acc[self._get_variable_index(v)] for v in variables]
        for g, a in zip(grads, acc):
            if g is not None:
                self.assign_add(a, g)
        self._commlib_counter.assign_add(1)
        is_update = tf.equal(tf.math.floormod(tf.convert_to_tensor(self._commlib_counter), k), 0)
        parent_apply = super().apply
        present = [g is not None for g in grads]

        def update():
            agg = [tf.convert_to_tensor(a) if p else None for a, p in zip(acc, present)]
            if self._commlib_avg_agg:
                agg = [None if a is None else a / tf.cast(k, a.dtype) for a in agg]
            parent_apply(self._commlib_reduce(agg, variables), variables)
            for a in acc:
                a.assign(tf.zeros_like(a))
            return tf.constant(True)

        def skip():
            self._iterations.assign_add(1)
            return tf.constant(False)

        if tf.executing_eagerly():
            update() if bool(is_update) else skip()
        else:
            tf.cond(is_update, update, skip)

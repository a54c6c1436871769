"""One-step delayed averaging in TensorFlow (the rule is commlib.delayed's):
``DelayedGradients``, the average in flight between the steps of a
``DistributedGradientTape(..., staleness=1)`` (a tape lives for one step) and
of the Keras ``DistributedOptimizer(..., staleness=1)``.

Its swap is one ordered commlib op (eagerly, or a numpy_function inside
tf.function): it waits for the pending average and starts averaging this
step's gradients, read in place by the core's background thread while
TensorFlow goes on. The averages live in reused aligned buffers (buffers.py),
two sets in turn: a set is reused only once nothing holds it, so an average a
caller keeps is never overwritten.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from commlib.delayed import DelayedArrays, GradientLayout, check_op
from commlib.ops import Average
from commlib.process_sets import check_process_set, communicates, instance_name
from commlib.reduce_args import predivide_scales, resolve_op

from .buffers import OutputPool
from .compression import Compression
from .execution import check_dtype, execute


class DelayedGradients:
    """The average in flight between the steps of a
    ``DistributedGradientTape(..., staleness=1, delayed=...)``: one-step
    delayed averaging in a custom TensorFlow loop (the rule is
    commlib.delayed's). Create it once, before the training loop, on every
    rank (of ``process_set``), in the same order on every rank, and hand it
    to every step's tape::

        delayed = hvd.DelayedGradients()             # once; owns the average in flight

        @tf.function                                  # or eagerly
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(model(x), y)
            tape = hvd.DistributedGradientTape(tape, staleness=1, delayed=delayed)
            grads = tape.gradient(loss, model.trainable_variables)   # avg(g_{t-1})
            delayed.apply_gradients(opt, zip(grads, model.trainable_variables))

        for x, y in data:
            train_step(x, y)
        grads = delayed.synchronize()                 # eagerly: the last pending average
        if grads is not None:
            opt.apply_gradients(zip(grads, model.trainable_variables))

    ``tape.gradient()`` starts averaging this step's gradients and returns
    the previous step's average. Step 0 (and the step after
    ``synchronize()``) has no average: eagerly ``gradient()`` returns a list
    of None and ``tape.has_average`` is False; inside tf.function the result
    is zeros and ``tape.has_average`` a boolean tensor.
    ``apply_gradients(optimizer, grads_and_vars)`` covers both: it applies
    the gradients only when there was an average (``tf.cond`` in a graph),
    so the wrapped optimizer is not stepped at step 0.

    Supported: eager and tf.function (not XLA), Keras 3 optimizers (any
    optimizer with ``apply_gradients`` eagerly), op Average or Sum with
    gradient_predivide_factor, process sets, the tape's ``compression``
    (Compression.fp16). IndexedSlices are averaged as dense tensors. The
    sources with a gradient must be the same at every step. Not with groups
    or local sources (ValueError)."""

    def __init__(self, op=Average, gradient_predivide_factor=1.0, process_set=None):
        op = resolve_op(op)
        check_op(op, "staleness=1")
        self.process_set = check_process_set(process_set, member=False)
        pool = OutputPool(layouts=1, per_layout=2)  # (pending, lent out: a set each)
        self._arrays = DelayedArrays(
            instance_name("delayed", self.process_set), pool.take, op,
            predivide_scales(op, gradient_predivide_factor), self.process_set,
            communicates(self.process_set))
        self._layout = GradientLayout()
        self._has_average = None  # of the last swap: a bool, or a bool tensor in a graph
        self._decompress = (Compression.none, [])  # (of the last swap: compression, ctxs)

    @property
    def pending(self) -> bool:
        """Whether an average is in flight (started, not applied yet)."""
        return self._arrays.pending

    def drop(self) -> None:
        """Forgets a pending average once it has ended (the weights were replaced)."""
        self._arrays.drop()

    def swap(self, grads, compression=Compression.none):
        """Starts averaging ``grads`` and returns ``(has_average, averages)``:
        the previous step's average; with ``compression`` (Compression.fp16)
        the gradients travel and wait in its wire dtype."""
        grads = list(grads)
        at = self._layout.present(grads)
        packed = [compression.compress(tf.convert_to_tensor(grads[i])) for i in at]
        tensors = [t for t, _ in packed]
        for t in tensors:
            check_dtype(t.dtype, "DistributedOptimizer(staleness=1) gradients")
        self._decompress = (compression, [ctx for _, ctx in packed])

        def fn(_cname, *arrays):
            have, prev = self._arrays.swap(list(arrays))
            return [np.array(have)] + (prev if have else [np.zeros_like(a) for a in arrays])

        outs = execute(fn, tensors, [tf.bool] + [t.dtype for t in tensors],
                       "CommlibDelayedSwap", process_set=self.process_set)
        for o, t in zip(outs, [()] + [t.shape for t in tensors]):
            o.set_shape(t)
        have = bool(outs[0]) if tf.executing_eagerly() else outs[0]
        self._has_average = have
        return have, self._averages(outs[1:] if have is not False else [])

    def _averages(self, values) -> list:
        """``values`` back in their dtypes, where the last swap's gradients were."""
        compression, ctxs = self._decompress
        return self._layout.scatter([compression.decompress(tf.convert_to_tensor(v), c)
                                     for v, c in zip(values, ctxs)])

    def finish(self):
        """Eagerly: waits for the pending average: ``(True, averages)`` (None
        where the step's gradient was None), or ``(False, None)``."""
        if not tf.executing_eagerly():
            raise RuntimeError("DelayedGradients.synchronize() runs eagerly (call it outside "
                               "tf.function, after the training loop)")
        have, arrays = self._arrays.finish()
        return (True, self._averages(arrays)) if have else (False, None)

    def apply_gradients(self, optimizer, grads_and_vars):
        """``optimizer.apply_gradients(grads_and_vars)`` when the last
        ``gradient()`` returned an average; nothing at step 0 (eagerly, or
        through tf.cond inside tf.function)."""
        if self._has_average is None:
            raise RuntimeError("apply_gradients() comes after the tape's gradient() in the same "
                               "step")
        pairs = list(grads_and_vars)
        have, self._has_average = self._has_average, None
        if isinstance(have, bool):
            if have:
                optimizer.apply_gradients(pairs)
            return
        build_outside_cond(optimizer, [v for _, v in pairs])

        def update():
            optimizer.apply_gradients(pairs)
            return tf.constant(True)

        tf.cond(have, update, lambda: tf.constant(False))

    def synchronize(self):
        """Eagerly: waits for the pending average and returns it (a list
        with None where the step's gradient was None), or None when none is
        pending. The caller applies it (before evaluating or saving)."""
        return self.finish()[1]


def build_outside_cond(optimizer, variables):
    """Builds a Keras optimizer's slots, if it is not built, before a tf.cond
    branch would (variables cannot be created inside one)."""
    if getattr(optimizer, "built", True) or not hasattr(optimizer, "build"):
        return
    import keras

    with keras.name_scope(optimizer.name, caller=optimizer):
        optimizer.build(variables)
    optimizer.built = True


class DelayedTapeMixin:
    """Put in front of the wrapped tape's class by DistributedGradientTape
    when staleness=1: gradient() swaps this step's gradients for the
    previous step's average."""

    has_average = None

    def register_local_source(self, source):
        raise ValueError("staleness=1: local sources are not supported")

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super(DelayedTapeMixin, self).gradient(
            target, sources, output_gradients=output_gradients,
            unconnected_gradients=unconnected_gradients)
        have, out = self._commlib_delayed.swap(tf.nest.flatten(grads), self._commlib_compression)
        self.has_average = have
        return tf.nest.pack_sequence_as(grads, out)

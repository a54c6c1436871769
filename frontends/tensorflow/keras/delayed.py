"""The Keras ``DistributedOptimizer(..., staleness=1)``: one-step delayed
gradient averaging.

    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), staleness=1)
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y, ...)
    opt.synchronize()      # applies the last pending average

Step t computes g_t at the current weights, starts averaging it across ranks
(the allreduce runs while the next step's forward and backward do) and
applies the average of the previous step's gradients with the wrapped
optimizer's rule (for SGD w_{t+1} = w_t - lr * avg(g_{t-1})). Step 0 applies
nothing (the wrapped optimizer is not stepped: ``iterations`` stays 0).
``synchronize()`` (eager) waits for the pending average and applies it; the
step after it applies nothing again. Replicas stay identical.

``weight_prediction=True`` (opt-in) computes each step's gradients at the
predicted weights w + (w - w_prev) they will be applied to (see
commlib.tensorflow.keras.weight_prediction; ``synchronize()`` puts the true
weights back).

``compression=Compression.fp16``: the gradients travel (and wait for the
next step) as float16, the averages are applied in the variables' dtype.
``backward_passes_per_step=k``: the gradients of k steps are summed locally
(averaged with average_aggregated_gradients) and every k-th step swaps that
aggregate for the previous one's average, so an update applies the average
of the k steps before the last k; the other steps only count in
``iterations``, and the first k-th step applies nothing (an aggregate left
over at the end stays local, as in the synchronous optimizer).
IndexedSlices gradients are averaged as dense tensors. The variables with a
gradient must be the same at every step (and on every rank). Not combined
with groups or local_layers, nor weight_prediction with
backward_passes_per_step > 1.
"""
from __future__ import annotations

import functools

import keras
import tensorflow as tf

from commlib.reduce_args import predivide_scales

from ..compression import Compression
from ..delayed import DelayedExchange
from .optimizer_base import DistributedOptimizerMixin, run_if
from .weight_prediction import WeightPrediction


class DelayedOptimizerMixin(DistributedOptimizerMixin):
    """Placed in front of the wrapped optimizer's class."""

    commlib_prediction = None  # WeightPrediction, built with the optimizer

    def commlib_delayed_setup(self, op, gradient_predivide_factor, process_set,
                              weight_prediction=False, compression=Compression.none):
        """Called once by DistributedOptimizer on the new optimizer (staleness=1)."""
        pre, post = predivide_scales(op, gradient_predivide_factor)
        s = functools.partial(object.__setattr__, self)
        s("_commlib_exchange", DelayedExchange(op, pre, post, process_set))
        s("_commlib_compression", compression)
        s("_commlib_pending_vars", None)  # (variables, positions) of the pending average
        s("staleness", 1)
        s("weight_prediction", weight_prediction)

    def build(self, variables):
        super().build(variables)
        if getattr(self, "weight_prediction", False) and self.commlib_prediction is None:
            object.__setattr__(self, "commlib_prediction", WeightPrediction(variables))

    def _commlib_update(self, grads, variables, predict):
        """The wrapped optimizer's rule on the true weights; with weight
        prediction and ``predict`` the model then holds the prediction."""
        prediction = self.commlib_prediction
        if prediction is not None:
            prediction.before_update()
        super(DistributedOptimizerMixin, self).apply(grads, variables)
        if prediction is not None and predict:
            prediction.predict()

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        parent_apply = super(DistributedOptimizerMixin, self).apply
        if not grads:
            return parent_apply(grads, trainable_variables)
        if trainable_variables is None:
            if not self.built:
                return parent_apply(grads, None)  # raises Keras' own error
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
        if not self.built:  # before tf.cond: no variables created in a branch
            with keras.name_scope(self.name, caller=self):
                self.build(variables)
            self.built = True
        if self._commlib_bpps > 1:  # (accumulates; every k-th step comes to the swap below)
            return self._commlib_accumulate_apply(grads, variables)
        self._commlib_apply_aggregate(grads, variables)

    def _commlib_apply_aggregate(self, grads, variables):
        """Starts averaging ``grads`` and applies the previous average."""
        present = [i for i, g in enumerate(grads) if g is not None]
        have, prev = self._commlib_exchange.swap_op(
            [tf.convert_to_tensor(grads[i]) for i in present], self._commlib_compression)
        object.__setattr__(self, "_commlib_pending_vars", (variables, present))
        full = [None] * len(grads)
        for i, g in zip(present, prev):
            full[i] = g

        run_if(have, lambda: self._commlib_update(full, variables, predict=True))

    def synchronize(self):
        """Waits for the pending average and applies it (eagerly: call it
        after fit(), before evaluating or saving); with weight prediction the
        model then holds the true weights."""
        have, averages = self._commlib_exchange.finish_tensors()
        if not have:
            if self.commlib_prediction is not None:
                self.commlib_prediction.restore()
            return
        variables, present = self._commlib_pending_vars
        full = [None] * len(variables)
        for i, a in zip(present, averages):
            full[i] = a
        self._commlib_update(full, variables, predict=False)

    def commlib_forget(self) -> None:
        """Drops the pending average and a prediction: the weights were
        replaced (KerasState's restore)."""
        self._commlib_exchange.drop()
        if self.commlib_prediction is not None:
            self.commlib_prediction.drop()

    @property
    def pending(self) -> bool:
        """Whether an average is in flight (started, not applied yet)."""
        return self._commlib_exchange.pending


def check_staleness_options(staleness, backward_passes_per_step, groups, local_layers,
                            weight_prediction):
    """ValueError for options DistributedOptimizer(staleness=1) does not take."""
    if isinstance(staleness, bool) or staleness != 1:
        raise ValueError(f"staleness must be 0 (synchronous) or 1 (one-step delayed "
                         f"averaging), got {staleness!r}")
    refused = {"groups": groups is not None, "local_layers": bool(local_layers),
               "weight_prediction with backward_passes_per_step > 1":
                   weight_prediction is True and int(backward_passes_per_step) > 1}
    bad = [k for k, v in refused.items() if v]
    if bad:
        raise ValueError(f"staleness=1 cannot be combined with {', '.join(bad)}")

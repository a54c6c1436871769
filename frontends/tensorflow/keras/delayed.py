"""The Keras ``DistributedOptimizer(..., staleness=1)``: one-step delayed
gradient averaging.

    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), staleness=1)
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y, ...)
    opt.synchronize()      # applies the last pending average

The rule is commlib.delayed's. ``weight_prediction=True``: see
commlib.tensorflow.keras.weight_prediction. ``compression=Compression.fp16``:
the gradients travel (and wait for the next step) as float16.
``backward_passes_per_step=k``: the gradients of k steps are summed locally
(averaged with average_aggregated_gradients) and every k-th step swaps that
aggregate for the previous one's average; the other steps only count in
``iterations``, and the first k-th step applies nothing. IndexedSlices
gradients are averaged as dense tensors. The variables with a gradient must
be the same at every step (and on every rank). Not combined with groups or
local_layers, nor weight_prediction with backward_passes_per_step > 1.
"""
from __future__ import annotations

import functools

import keras

from commlib.delayed import apply_average, check_staleness

from ..compression import Compression
from ..delayed_tape import DelayedGradients
from .optimizer_base import DistributedOptimizerMixin, run_if
from .weight_prediction import WeightPrediction


class DelayedOptimizerMixin(DistributedOptimizerMixin):
    """Placed in front of the wrapped optimizer's class."""

    commlib_prediction = None  # WeightPrediction, built with the optimizer

    def commlib_delayed_setup(self, op, gradient_predivide_factor, process_set,
                              weight_prediction=False, compression=Compression.none):
        """Called once by DistributedOptimizer on the new optimizer (staleness=1)."""
        s = functools.partial(object.__setattr__, self)
        s("_commlib_delayed", DelayedGradients(op, gradient_predivide_factor, process_set))
        s("_commlib_compression", compression)
        s("_commlib_pending_vars", None)  # the variables of the pending average
        s("staleness", 1)
        s("weight_prediction", weight_prediction)

    def build(self, variables):
        super().build(variables)
        if getattr(self, "weight_prediction", False) and self.commlib_prediction is None:
            object.__setattr__(self, "commlib_prediction", WeightPrediction(variables))

    def _commlib_update(self, grads, variables, predict):
        """The wrapped optimizer's rule (see commlib.delayed.apply_average)."""
        apply_average(lambda: super(DistributedOptimizerMixin, self).apply(grads, variables),
                      self.commlib_prediction, predict)

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
        have, full = self._commlib_delayed.swap(grads, self._commlib_compression)
        object.__setattr__(self, "_commlib_pending_vars", variables)
        run_if(have, lambda: self._commlib_update(full, variables, predict=True))

    def synchronize(self):
        """Waits for the pending average and applies it (eagerly: call it
        after fit(), before evaluating or saving); with weight prediction the
        model then holds the true weights."""
        averages = self._commlib_delayed.synchronize()
        if averages is not None:
            self._commlib_update(averages, self._commlib_pending_vars, predict=False)
        elif self.commlib_prediction is not None:
            self.commlib_prediction.restore()

    def commlib_forget(self) -> None:
        """Drops the pending average and a prediction: the weights were
        replaced (KerasState's restore)."""
        self._commlib_delayed.drop()
        if self.commlib_prediction is not None:
            self.commlib_prediction.drop()

    @property
    def pending(self) -> bool:
        """Whether an average is in flight (started, not applied yet)."""
        return self._commlib_delayed.pending


def check_staleness_options(staleness, backward_passes_per_step, groups, local_layers,
                            weight_prediction):
    """ValueError for options DistributedOptimizer(staleness=1) does not take."""
    check_staleness(staleness, refused={
        "groups": groups is not None, "local_layers": bool(local_layers),
        "weight_prediction with backward_passes_per_step > 1":
            weight_prediction is True and int(backward_passes_per_step) > 1})

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

from commlib.delayed import DelayedRule, check_staleness

from ..compression import Compression
from ..delayed_tape import DelayedGradients, build_outside_cond
from .optimizer_base import DistributedOptimizerMixin, run_if
from .weight_prediction import WeightPrediction


class DelayedOptimizerMixin(DistributedOptimizerMixin):
    """Placed in front of the wrapped optimizer's class."""

    def commlib_delayed_setup(self, op, gradient_predivide_factor, process_set,
                              weight_prediction=False, compression=Compression.none):
        """Called once by DistributedOptimizer on the new optimizer (staleness=1)."""
        s = functools.partial(object.__setattr__, self)
        s("_commlib_delayed", DelayedGradients(op, gradient_predivide_factor, process_set))
        s("_commlib_rule", DelayedRule(self._commlib_delayed, self._commlib_update, run_if))
        s("_commlib_compression", compression)
        s("_commlib_pending_vars", None)  # the variables of the pending average
        s("staleness", 1)
        s("weight_prediction", weight_prediction)

    @property
    def commlib_prediction(self):
        """The WeightPrediction, built with the optimizer (or None)."""
        rule = getattr(self, "_commlib_rule", None)
        return rule.prediction if rule is not None else None

    def build(self, variables):
        super().build(variables)
        if getattr(self, "weight_prediction", False) and self.commlib_prediction is None:
            self._commlib_rule.prediction = WeightPrediction(variables)

    def _commlib_update(self, averages):
        """The wrapped optimizer's rule, on the variables of the average."""
        super(DistributedOptimizerMixin, self).apply(averages, self._commlib_pending_vars)

    def _commlib_apply_aggregate(self, grads, variables):
        """Starts averaging ``grads`` and applies the previous average (the
        optimizer built first: before any tf.cond)."""
        build_outside_cond(self, variables)
        object.__setattr__(self, "_commlib_pending_vars", variables)
        self._commlib_rule.step(grads, self._commlib_compression)

    def synchronize(self):
        """Waits for the pending average and applies it (eagerly: call it
        after fit(), before evaluating or saving); with weight prediction the
        model then holds the true weights."""
        self._commlib_rule.synchronize()

    def commlib_forget(self) -> None:
        """Drops the pending average and a prediction: the weights were
        replaced (KerasState's restore)."""
        self._commlib_rule.forget()

    @property
    def pending(self) -> bool:
        """Whether an average is in flight (started, not applied yet)."""
        return self._commlib_rule.pending


def check_staleness_options(staleness, backward_passes_per_step, groups, local_layers,
                            weight_prediction):
    """ValueError for options DistributedOptimizer(staleness=1) does not take."""
    check_staleness(staleness, refused={
        "groups": groups is not None, "local_layers": bool(local_layers),
        "weight_prediction with backward_passes_per_step > 1":
            weight_prediction is True and int(backward_passes_per_step) > 1})

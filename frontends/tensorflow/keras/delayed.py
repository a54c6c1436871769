"""The Keras ``DistributedOptimizer(..., staleness=1)`` (documented there):
commlib.delayed's rule as an optimizer mixin."""
from __future__ import annotations

import functools

from commlib.delayed import DelayedRule

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

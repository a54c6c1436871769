"""Delayed gradient averaging, ``DistributedOptimizer(..., staleness=1)``
(documented there): commlib.delayed's rule with torch's tensors."""
from __future__ import annotations

from contextlib import contextmanager

from commlib.delayed import DelayedRule, StartedExchanges, check_op, check_staleness

from ._grad_exchange import PendingGradients, assign_grads, closure_loss
from .optimizer import DistributedOptimizerBase, share_state
from .weight_prediction import WeightPrediction


class _DelayedOptimizer(DistributedOptimizerBase):
    """Mixin placed before the wrapped optimizer's class (set up by
    ``share_state``, which checks the parameters and options across ranks)."""

    def _delayed_init(self):
        check_op(self.op, "staleness=1")
        self._rule = DelayedRule(StartedExchanges(self._start_pending), self._update,
                                 prediction=WeightPrediction(self._params)
                                 if self.weight_prediction else None)

    def true_weights(self) -> dict:
        """With weight_prediction, {id(parameter): its true (not predicted)
        weights} while the model holds predicted ones; else {}."""
        prediction = self._rule.prediction
        return prediction.true_weights() if prediction is not None else {}

    def _register_hooks(self, params):
        pass  # nothing starts during backward: step() sends all gradients at once

    def _signature(self) -> list:
        sig = super()._signature()
        sig[0] = sig[0] + (("staleness", self.staleness),
                           ("weight_prediction", self.weight_prediction))
        return sig

    def _start_pending(self):
        return PendingGradients(
            self._params, name=self._internal("delayed"), op=self.op, scales=self._scales,
            compression=self._compression, process_set=self.process_set,
            communicate=self._reduces, take=True)

    def _update(self, averages):
        assign_grads(self._params, averages)
        super(DistributedOptimizerBase, self).step()

    def step(self, closure=None):
        """Starts averaging this step's gradients and applies the previous
        step's average (nothing at the first step or after synchronize())."""
        loss = closure_loss(closure)
        self._rule.step()
        return loss

    def synchronize(self):
        """Waits for the pending average and applies it (before evaluating or
        saving the model); does nothing when none is pending."""
        self._rule.synchronize()
        self._synchronized = True

    @property
    def pending(self) -> bool:
        """Whether an average is in flight (started, not applied yet)."""
        return self._rule.pending

    @contextmanager
    def skip_synchronize(self):
        raise ValueError("skip_synchronize() is not available with staleness=1: step() applies "
                         "the previous step's averaged gradients; clip the local gradients "
                         "before step() instead")
        yield  # pragma: no cover

    def zero_grad(self, set_to_none: bool = True):
        return super(DistributedOptimizerBase, self).zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict):
        """Loads the state; a pending average (of the state before) is waited
        for and dropped, a failed one too (after a lost rank, as an elastic
        restore does)."""
        self._rule.forget()
        return super().load_state_dict(state_dict)


_DelayedOptimizer.step.hooked = True


def delayed_optimizer(optimizer, staleness, dist_args, weight_prediction=False):
    """The ``staleness=1`` form of DistributedOptimizer; ``dist_args`` are
    DistributedOptimizerBase._dist_init's."""
    check_staleness(staleness)
    base = optimizer.__class__
    cls = type(base.__name__, (_DelayedOptimizer, base),
               {"__module__": DistributedOptimizerBase.__module__, "__doc__": base.__doc__})
    dist = share_state(cls, optimizer, dist_args, staleness=staleness,
                       weight_prediction=weight_prediction)
    dist._delayed_init()
    return dist

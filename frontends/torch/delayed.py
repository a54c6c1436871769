"""Delayed gradient averaging: ``DistributedOptimizer(..., staleness=1)``.

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   staleness=1)
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()        # starts averaging g_t, applies avg(g_{t-1})
    opt.synchronize()     # applies the last pending average (before eval/saving)

Step t computes the gradients g_t at the current parameters p_t; ``step()``
starts their averaging across ranks (one grouped allreduce, progressed by the
background thread while the caller runs the next forward and backward) and
applies the average of the previous step's gradients with the wrapped
optimizer's rule: for SGD p_{t+1} = p_t - lr * avg(g_{t-1}). Step 0 applies
nothing (the wrapped optimizer is not stepped). ``synchronize()`` waits for
the pending average and applies it; the step after it applies nothing again.
Every rank applies the same averaged gradients, so replicas stay identical.

In ``step()`` the previous average is waited for before the new one starts
(one request of the optimizer's name in flight at a time), and the optimizer's
update runs while the new one travels. The gradient tensors are handed to the
allreduce without a copy: after ``step()``, ``p.grad`` holds the averaged
gradient that was applied (None after a step that applied nothing), not the
local gradient of this step.

Not available with staleness: ``groups`` (all gradients go in one group
anyway) and ``skip_synchronize`` (clip the local gradients before ``step()``
instead). ``state_dict()`` does not include the pending average: call
``synchronize()`` before saving. On ranks outside ``process_set`` (and on a
set of one rank) the same one-step delay applies to the local gradients.

``weight_prediction=True`` (opt-in) computes each step's gradients at a
prediction of the weights they will be applied to, p + (p - p_prev), instead
of at p (see commlib.torch.weight_prediction): the model holds the predicted
weights between steps, and ``synchronize()`` puts the true ones back (call it
before evaluating, saving or loading the model).
"""
from __future__ import annotations

from contextlib import contextmanager

from ._grad_exchange import PendingGradients, assign_grads, settle
from .mpi_ops import Average, Sum
from .optimizer import DistributedOptimizerBase
from .weight_prediction import WeightPrediction


class _DelayedOptimizer(DistributedOptimizerBase):
    """Mixin placed before the wrapped optimizer's class (after set-up by
    ``DistributedOptimizerBase._dist_init``, which checks the parameters and
    options across ranks)."""

    def _delayed_init(self, staleness, weight_prediction, *dist_args):
        self.staleness = staleness
        self.weight_prediction = weight_prediction
        self._pending = None
        self._dist_init(*dist_args)
        if self.op not in (Average, Sum):
            raise ValueError("staleness=1 supports op=Average or op=Sum only")
        self._prediction = WeightPrediction(self._params) if weight_prediction else None

    def true_weights(self) -> dict:
        """With weight_prediction, {id(parameter): its true (not predicted)
        weights} while the model holds predicted ones; else {}."""
        return self._prediction.true_weights() if self._prediction is not None else {}

    def _register_hooks(self, params):
        pass  # nothing starts during backward: step() sends all gradients at once

    def _signature(self) -> list:
        sig = super()._signature()
        sig[0] = sig[0] + (("staleness", self.staleness),
                           ("weight_prediction", self.weight_prediction))
        return sig

    # ------------------------------------------------------------ the delay

    def _start_pending(self):
        self._pending = PendingGradients(
            self._params, name=self._internal("delayed"), op=self.op, scales=self._scales,
            compression=self._compression, process_set=self.process_set,
            communicate=self._reduces, take=True)

    def _apply(self, pending, predict=False):
        """Applies the averaged gradients of ``pending`` with the wrapped
        optimizer's rule (to the true weights); with weight prediction and
        ``predict``, the model then holds the predicted weights."""
        assign_grads(pending.params, pending.wait())
        if self._prediction is not None:
            self._prediction.before_update()
        super(DistributedOptimizerBase, self).step()
        if self._prediction is not None and predict:
            self._prediction.predict()

    def step(self, closure=None):
        """Starts averaging this step's gradients and applies the previous
        step's average (nothing at the first step or after synchronize())."""
        loss = None
        if closure is not None:
            import torch

            with torch.enable_grad():
                loss = closure()
        previous = self._pending
        if previous is not None:
            # Done before the next request of the same name starts; a failed
            # one stays pending and raises again at every step/synchronize().
            previous.wait()
        self._pending = None
        self._start_pending()
        if previous is not None:
            self._apply(previous, predict=True)
        elif self._prediction is not None:
            self._prediction.restore()
        return loss

    def synchronize(self):
        """Waits for the pending average and applies it (before evaluating or
        saving the model); does nothing when none is pending."""
        previous = self._pending
        if previous is not None:
            previous.wait()  # (a failed one stays pending: its error again)
            self._pending = None
            self._apply(previous)
        elif self._prediction is not None:
            self._prediction.restore()
        self._synchronized = True

    @property
    def pending(self) -> bool:
        """Whether an average is in flight (started, not applied yet)."""
        return self._pending is not None

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
        previous, self._pending = self._pending, None
        settle(previous)
        if self._prediction is not None:
            self._prediction.drop()
        return super().load_state_dict(state_dict)


_DelayedOptimizer.step.hooked = True


def delayed_optimizer(optimizer, staleness, dist_args, weight_prediction=False):
    """The ``staleness=1`` form of DistributedOptimizer (see the module's
    docstring); ``dist_args`` are DistributedOptimizerBase._dist_init's."""
    if staleness != 1:
        raise ValueError(f"staleness must be 0 (synchronous) or 1 (one-step delayed averaging), "
                         f"got {staleness!r}")
    if not isinstance(weight_prediction, bool):
        raise ValueError(f"weight_prediction must be True or False, got {weight_prediction!r}")
    base = optimizer.__class__
    cls = type(base.__name__, (_DelayedOptimizer, base),
               {"__module__": DistributedOptimizerBase.__module__, "__doc__": base.__doc__})
    dist = cls.__new__(cls)
    dist.__dict__.update(optimizer.__dict__)
    dist._delayed_init(staleness, weight_prediction, *dist_args)
    return dist

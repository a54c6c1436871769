"""Weight prediction for delayed averaging:
``DistributedOptimizer(..., staleness=1, weight_prediction=True)``.

With one step of delay the gradient computed at p_t is applied to p_{t+1}.
Weight prediction (linear weight prediction as in PipeMare, arXiv 1910.05124,
and Kosson et al., arXiv 2003.11666) computes it at an estimate of p_{t+1}
instead: after a step that applied an update, the model holds the predicted
weights

    p^ = p + (p - p_prev)        (p: the weights after the update,
                                  p_prev: the weights before it)

for the next forward and backward, and the true weights p are kept aside;
the next ``step()`` puts them back before the wrapped optimizer updates them.
After a step that applied nothing (step 0, the step after ``synchronize()``)
the model holds the true weights. ``synchronize()`` puts the true weights
back (call it before evaluating, saving or loading the model).

Costs: two extra copies of the parameters in memory and, per step, three
passes over them (a copy back, a copy aside and the extrapolation).
Replicas stay bitwise identical (every rank does the same arithmetic).
"""
from __future__ import annotations

import torch


class WeightPrediction:
    """Keeps the true weights of ``params`` while the model holds predicted
    ones (see the module's docstring)."""

    def __init__(self, params):
        self._params = list(params)
        self._true = None   # the true weights while the model holds a prediction
        self._spare = None  # a buffer of the same shapes (reused)
        self.predicting = False

    def _buffers(self):
        return [torch.empty_like(p, memory_format=torch.contiguous_format)
                for p in self._params]

    @torch.no_grad()
    def before_update(self) -> None:
        """Puts the true weights back and remembers them as p_prev."""
        restored = self.predicting
        self.restore()
        if self._true is None:
            self._true = self._buffers()
        if not restored:
            torch._foreach_copy_(self._true, self._params)

    @torch.no_grad()
    def restore(self) -> None:
        """Puts the true weights back into the parameters (if the model holds
        a prediction)."""
        if self.predicting:
            torch._foreach_copy_(self._params, self._true)
            self.predicting = False

    @torch.no_grad()
    def predict(self) -> None:
        """After an update from the saved weights p_prev to p: keeps p aside
        and puts p + (p - p_prev) into the parameters."""
        if self._spare is None:
            self._spare = self._buffers()
        torch._foreach_copy_(self._spare, self._params)            # p, kept aside
        torch._foreach_lerp_(self._params, self._true, -1.0)       # p + (p - p_prev)
        self._true, self._spare = self._spare, self._true
        self.predicting = True

    def true_weights(self) -> dict:
        """{id(parameter): its true weights} while the model holds a
        prediction, else {} (what an elastic commit saves)."""
        if not self.predicting:
            return {}
        return {id(p): t for p, t in zip(self._params, self._true)}

    def drop(self) -> None:
        """Forgets a prediction without restoring (the caller replaces the
        weights, e.g. loads a checkpoint)."""
        self.predicting = False

"""Weight prediction for the Keras delayed optimizer:
``DistributedOptimizer(..., staleness=1, weight_prediction=True)``.

The rule of ``commlib.torch.optim.weight_prediction``: with one step of delay the
gradient computed at w_t is applied to w_{t+1}, so after a step that applied
an update the model holds the predicted weights

    w^ = w + (w - w_prev)        (w: the weights after the update,
                                  w_prev: the weights before it)

for the next forward and backward, and the true weights are kept aside in
variables of their own (one per trainable variable; not the optimizer's:
its saved state stays that of the wrapped optimizer, which a plain one
loads); the next update puts them back before the wrapped optimizer's rule
runs.
After a step that applied nothing (step 0, the step after ``synchronize()``)
the model holds the true weights. ``synchronize()`` puts them back (call it
before evaluating, saving or loading weights: a prediction left in the model
would be saved, and weights loaded under one would be overwritten).

Works eagerly and inside the compiled train step (the flag saying whether
the model holds a prediction is a variable too). Costs one copy of the
trainable variables and, per step, four passes over them (put back, the
extrapolation, keep aside, put the prediction in). Replicas stay bitwise
identical (every rank does the same arithmetic).
"""
from __future__ import annotations

import tensorflow as tf

from .optimizer_base import own_counter, own_zeros_like, run_if


class WeightPrediction:
    """The true weights of the variables an optimizer is built for while
    the model holds a prediction (see the module's docstring); created in
    the optimizer's ``build``, with ``variables``: the Keras variables."""

    def __init__(self, variables):
        variables = list(variables)
        self._pairs = list(zip(variables, own_zeros_like(variables, "commlib_true_weights")))
        self._predicting = own_counter("commlib_predicting")

    @property
    def variables(self) -> list:
        """The copies of the weights (for memory_report)."""
        return [s for _, s in self._pairs]

    @property
    def predicting(self):
        """A bool tensor: whether the model holds a prediction."""
        return tf.not_equal(tf.convert_to_tensor(self._predicting), 0)

    def _put_back(self) -> None:
        for v, s in self._pairs:
            v.assign(s)

    def _keep(self) -> None:
        for v, s in self._pairs:
            s.assign(v)

    def before_update(self) -> None:
        """Puts the true weights back (or, holding none aside, keeps the
        current ones): afterwards the slots hold w_prev."""
        run_if(self.predicting, self._put_back, self._keep)
        self._predicting.assign(0)

    def predict(self) -> None:
        """After an update from w_prev (in the slots) to w: keeps w aside and
        puts w + (w - w_prev) into the variables."""
        for v, s in self._pairs:
            w = tf.convert_to_tensor(v)
            guess = w + (w - tf.convert_to_tensor(s))
            s.assign(w)
            v.assign(guess)
        self._predicting.assign(1)

    def true_values(self) -> dict:
        """{id(variable): its true weights (numpy)} while the model holds a
        prediction, else {} (what an elastic commit saves)."""
        if not bool(self.predicting):
            return {}
        return {id(v): s.numpy() for v, s in self._pairs}

    def drop(self) -> None:
        """Forgets a prediction without restoring (the weights were
        replaced: an elastic restore)."""
        self._predicting.assign(0)

    def restore(self) -> None:
        """Puts the true weights back if the model holds a prediction."""
        run_if(self.predicting, self._put_back)
        self._predicting.assign(0)

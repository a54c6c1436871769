"""Keras DistributedOptimizer(..., staleness=1, weight_prediction=True) in
model.fit (compiled and run_eagerly) on every rank against a single-process
simulation of the rule: the gradients of step t are taken at the predicted
weights w + (w - w_prev) (w after the last applied update, w_prev before it;
the true weights after a step that applied nothing), averaged, and applied
one step later to the true weights. After every step the model holds the
simulation's predicted weights (within 1e-5, bitwise identical across
ranks); synchronize() puts the true weights back; the step after it applies
and predicts nothing; a saved model's optimizer state is the wrapped
optimizer's; an elastic commit holds the true weights; error cases."""
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf
from tf_async_common import B, DATA, average, grads_of, make_model, weights
from tf_common import done, expect_raises, fail, max_rel_err, same_on_all_ranks

import commlib
import commlib.keras as hvd
import commlib.tensorflow

r, n = hvd.rank(), hvd.size()
worst = {}


def set_weights(model, values):
    for v, w in zip(model.trainable_variables, values):
        v.assign(w)


class Simulation:
    """The rule on one process: ``true`` holds the true weights, the
    gradients are taken on ``at`` (set to the predicted weights)."""

    def __init__(self, make_opt):
        self.true, self.at, self.opt = make_model(), make_model(), make_opt()
        self.prev = None  # the true weights before the last applied update
        self.pending = None

    def predicted(self):
        w = weights(self.true)
        return w if self.prev is None else [a + (a - b) for a, b in zip(w, self.prev)]

    def apply(self, grads, predict):
        before = weights(self.true)
        self.opt.apply(grads, self.true.trainable_variables)
        self.prev = before if predict else None

    def step(self, t):
        set_weights(self.at, self.predicted())
        avg = average([grads_of(self.at, k, t) for k in range(n)])
        if self.pending is not None:
            self.apply(self.pending, predict=True)
        else:
            self.prev = None
        self.pending = avg

    def synchronize(self):
        if self.pending is not None:
            self.apply(self.pending, predict=False)
        self.pending, self.prev = None, None


def check(model, want, what):
    err = max_rel_err(weights(model), want)
    worst[what] = max(worst.get(what, 0.0), err)
    if not err <= 1e-5:
        fail(f"{what}: max relative error {err:.3g} against the simulation")


def train(make_opt, what, run_eagerly=False, wrap=hvd.DistributedOptimizer):
    sim = Simulation(make_opt)
    model = make_model()
    opt = wrap(make_opt(), staleness=1, weight_prediction=True)

    class Check(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            sim.step(batch)
            check(model, sim.predicted(), f"{what} step {batch}")
            same_on_all_ranks(weights(model), f"{what} step {batch}")

    model.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    x, y = DATA[r]
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=[Check()])
    if max_rel_err(weights(model), weights(sim.true)) < 1e-3:
        fail(f"{what}: the model holds the true weights between steps, not a prediction")
    opt.synchronize()
    sim.synchronize()
    check(model, weights(sim.true), f"{what} after synchronize")
    same_on_all_ranks(weights(model), f"{what} synchronize")
    # The step after synchronize() applies nothing and predicts nothing.
    before, iterations = weights(model), int(opt.iterations)
    model.fit(x[:B], y[:B], batch_size=B, epochs=1, shuffle=False, verbose=0)
    if max_rel_err(weights(model), before) != 0.0 or int(opt.iterations) != iterations:
        fail(f"{what}: the step after synchronize() changed the weights")
    sim.step(0)
    opt.synchronize()
    sim.synchronize()
    check(model, weights(sim.true), f"{what} second synchronize")
    opt.synchronize()  # nothing pending, no prediction: nothing changes
    check(model, weights(sim.true), f"{what} idle synchronize")
    return model, opt


def saved_state_is_the_wrapped_optimizers(model, opt):
    """The prediction's copies are not optimizer variables: a saved model's
    optimizer state loads into the plain optimizer (all of it), and
    memory_report counts the copies as parameters."""
    path = os.path.join(tempfile.mkdtemp(), f"rank{r}.keras")
    model.save(path)
    loaded = hvd.load_model(path)
    got = [v.numpy() for v in loaded.optimizer.variables]
    want = [v.numpy() for v in opt.variables]
    if len(got) != len(want) or any(not np.array_equal(a, b) for a, b in zip(got, want)):
        fail(f"the loaded optimizer state differs: {len(got)} variables, saved {len(want)}")
    report = hvd.memory_report(model, opt)
    weight_bytes = sum(w.nbytes for w in weights(model))
    if report["parameters"] != 2 * weight_bytes:
        fail(f"memory_report parameters {report['parameters']}, expected 2 x {weight_bytes}")


# (commlib.tensorflow's and commlib's DistributedOptimizer pass the Keras
# wrapper's options on.)
train(lambda: keras.optimizers.SGD(0.1, momentum=0.9), "SGD momentum")
train(lambda: keras.optimizers.Adam(0.01), "Adam eager", run_eagerly=True,
      wrap=commlib.tensorflow.DistributedOptimizer)
saved_state_is_the_wrapped_optimizers(*train(
    lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05), "AdamW",
    wrap=commlib.DistributedOptimizer))



def elastic_state_commits_true_weights():
    """An elastic commit holds the true weights, not the prediction the model
    holds between steps; restore() puts them back and drops the pending
    average; the next step applies nothing."""
    def make_opt():
        return keras.optimizers.SGD(0.1, momentum=0.9)

    sim = Simulation(make_opt)
    model = make_model()
    opt = hvd.DistributedOptimizer(make_opt(), staleness=1, weight_prediction=True)
    model.compile(optimizer=opt, loss="mse")
    x, y = DATA[r]
    model.fit(x[:4 * B], y[:4 * B], batch_size=B, shuffle=False, verbose=0)
    for t in range(4):
        sim.step(t)
    state = hvd.elastic.KerasState(model, opt)  # (keeps a snapshot, as commit() does)
    check(model, sim.predicted(), "elastic: the model before the commit")
    state.restore()
    check(model, weights(sim.true), "elastic: the weights restored")
    if opt.pending:
        fail("elastic: an average is still pending after restore()")
    model.fit(x[:B], y[:B], batch_size=B, shuffle=False, verbose=0)
    check(model, weights(sim.true), "elastic: the step after restore()")
    opt.synchronize()  # (its average is in flight: no rank leaves before it is done)


elastic_state_commits_true_weights()
sgd = keras.optimizers.SGD(0.1)
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(sgd, weight_prediction=True),
              "weight_prediction without staleness", "needs staleness=1")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(sgd, staleness=1,
                                                           weight_prediction="yes"),
              "weight_prediction not a bool", "True or False")
expect_raises(ValueError, lambda: commlib.tensorflow.DistributedOptimizer(
    tf.compat.v1.train.GradientDescentOptimizer(0.1), staleness=1), "staleness for TF1",
    "Keras optimizers only")
expect_raises(TypeError, lambda: commlib.tensorflow.DistributedOptimizer(sgd, stalenes=1),
              "misspelt option", "stalenes")
if r == 0:
    print(f"keras weight prediction max relative error {max(worst.values()):.3g}", flush=True)
done()

"""DistributedOptimizer(..., staleness=1, weight_prediction=True) on every
rank against a single-process simulation of the rule: the gradients of step t
are computed at the predicted weights p + (p - p_prev) (p after the last
applied update, p_prev before it; the true weights after a step that applied
nothing), averaged, and applied one step later to the true weights. After
every step the model holds the simulation's predicted weights (within 1e-5,
bitwise identical across ranks); synchronize() puts the true weights back;
load_state_dict drops a prediction; an elastic commit holds the true
weights; error cases."""
import torch

import commlib.torch as hvd
from _common import done, expect_raises, fail
from torch_async_common import (STEPS, adam, average, check_close, clone, grads_of, loss_of,
                                mlp, same_on_all_ranks, sgd, step_applies_nothing)

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()


class Simulation:
    """The rule on one process: ``true`` holds the true weights; the
    gradients are taken on ``model_at`` (the predicted weights)."""

    def __init__(self, make_opt):
        self.true = mlp(1)
        self.opt = make_opt(self.true.parameters())
        self.prev = None  # the true weights before the last applied update
        self.pending = None

    def predicted(self):
        at = clone(self.true)
        if self.prev is not None:
            with torch.no_grad():
                for q, p, old in zip(at.parameters(), self.true.parameters(), self.prev):
                    q.copy_(p + (p - old))
        return at

    def apply(self, grads, predict):
        before = [p.detach().clone() for p in self.true.parameters()]
        for p, g in zip(self.true.parameters(), grads):
            p.grad = g
        self.opt.step()
        self.prev = before if predict else None

    def step(self, t):
        at = self.predicted()
        avg = average([grads_of(at, k, t) for k in range(n)])
        if self.pending is not None:
            self.apply(self.pending, predict=True)
        else:
            self.prev = None
        self.pending = avg

    def synchronize(self):
        if self.pending is not None:
            self.apply(self.pending, predict=False)
        self.pending, self.prev = None, None


def train(make_opt, what, tol=1e-5):
    model = mlp(1)
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters(), staleness=1,
                                   weight_prediction=True)
    sim = Simulation(make_opt)
    worst = 0.0
    for t in range(STEPS):
        opt.zero_grad()
        loss_of(model, r, t).backward()
        opt.step()
        sim.step(t)
        worst = max(worst, check_close(model, sim.predicted(), f"{what}: step {t}", tol))
        same_on_all_ranks(model, f"{what}.{t}")
    if check_close(model, sim.true, f"{what}: prediction", tol=1.0) < 1e-3:
        fail(f"{what}: the model holds the true weights between steps, not a prediction")
    opt.synchronize()
    sim.synchronize()
    worst = max(worst, check_close(model, sim.true, f"{what}: after synchronize", tol))
    same_on_all_ranks(model, f"{what}.sync")
    # The step after synchronize() applies nothing and predicts nothing.
    step_applies_nothing(model, opt, STEPS, f"{what}: step after synchronize")
    sim.step(STEPS)
    opt.synchronize()
    sim.synchronize()
    check_close(model, sim.true, f"{what}: second synchronize", tol)
    return worst


err_sgd = train(sgd, "SGD")
err_adam = train(adam, "Adam")
if r == 0:
    print(f"weight prediction max relative error SGD {err_sgd:.3g}, Adam {err_adam:.3g}",
          flush=True)

# An elastic commit holds the true weights, not the prediction the model holds
# between steps; restore() puts them back and drops the pending average.
model = mlp(1)
opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                               staleness=1, weight_prediction=True)
sim = Simulation(sgd)
for t in range(3):
    opt.zero_grad()
    loss_of(model, r, t).backward()
    opt.step()
    sim.step(t)
state = hvd.elastic.TorchState(model, opt)  # (keeps a snapshot, as commit() does)
check_close(model, sim.predicted(), "elastic: the model before the commit", 1e-5)
state.restore()
check_close(model, sim.true, "elastic: the weights restored", 1e-5)
if opt.pending:
    fail("elastic: an average is still pending after restore()")

# load_state_dict drops a prediction: the next step does not overwrite the
# weights the caller loads.
model = mlp(1)
opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                               staleness=1, weight_prediction=True)
for t in range(3):
    opt.zero_grad()
    loss_of(model, r, t).backward()
    opt.step()
saved = opt.state_dict()
opt.load_state_dict(saved)
loaded = mlp(5)
model.load_state_dict(loaded.state_dict())
opt.zero_grad()
loss_of(model, r, 3).backward()
opt.step()
check_close(model, loaded, "weights loaded after load_state_dict", tol=0.0)
opt.synchronize()

# ---------------------------------------------------------------- errors

plain = mlp(2)
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    sgd(plain.parameters()), named_parameters=plain.named_parameters(), weight_prediction=True),
    "weight_prediction without staleness", "needs staleness=1")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    sgd(plain.parameters()), named_parameters=plain.named_parameters(), staleness=1,
    weight_prediction="yes"), "weight_prediction not a bool", "True or False")
err = expect_raises(hvd.CollectiveMismatchError, lambda: hvd.DistributedOptimizer(
    sgd(plain.parameters()), named_parameters=plain.named_parameters(), staleness=1,
    weight_prediction=(r == 0)), "weight_prediction differs across ranks")
if "weight_prediction" not in str(err):
    fail(f"the mismatch error does not name weight_prediction: {err}")
done()

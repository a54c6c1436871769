"""commlib.torch.LocalSGD on every rank: local SGD and DiLoCo (with and
without warm-up) against a single-process simulation that trains one replica
per rank on that rank's data and applies the meeting rule: after every step
this rank's model equals its simulated replica within 1e-5, and after every
meeting the replicas are bitwise identical across ranks (BatchNorm's running
statistics too: averaged at meetings); streaming meetings
(one round stale, local SGD and DiLoCo) against a simulation of that rule,
identical replicas after synchronize(); synchronize(), state_dict round
trip, error cases."""
import copy

import torch

import commlib.torch as hvd
from _common import done, expect_raises, fail
from torch_async_common import (STEPS, average, check_close, clone, grads_of, loss_of, mlp,
                                mlp_bn, same_on_all_ranks, state_tensors)

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()


def inner_sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def inner_adamw(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)


def outer_nesterov(params):
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


class Simulation:
    """One replica (and inner optimizer) per rank; the meeting rule of
    local SGD (average) or DiLoCo (outer step from the anchor)."""

    def __init__(self, make_inner, make_outer, period, warmup, streaming=False, make_model=mlp):
        self.replicas = [make_model(1) for _ in range(n)]
        self.inner = [make_inner(m.parameters()) for m in self.replicas]
        self.anchor = make_model(1)  # also the model the outer optimizer steps
        self.outer = make_outer(self.anchor.parameters()) if make_outer else None
        self.period, self.warmup, self.streaming = period, warmup, streaming
        self.snapshots = None  # streaming: every replica's parameters at the last meeting

    def step(self, t):
        """Returns whether a meeting followed this step."""
        if t < self.warmup:
            avg = average([grads_of(m, k, t) for k, m in enumerate(self.replicas)])
            for m, opt in zip(self.replicas, self.inner):
                for p, g in zip(m.parameters(), avg):
                    p.grad = g.clone()
                opt.step()
            self.anchor.load_state_dict(self.replicas[0].state_dict())
            return False
        for k, (m, opt) in enumerate(zip(self.replicas, self.inner)):
            grads_of(m, k, t)
            opt.step()
        if (t - self.warmup + 1) % self.period:
            return False
        if self.streaming:
            self.finish_stream()
            self.snapshots = [[p.detach().clone() for p in state_tensors(m)]
                              for m in self.replicas]
        else:
            self.meet()
        return True

    @torch.no_grad()
    def finish_stream(self):
        """The one-round-stale meeting: the meeting step with the average of
        the last snapshots, plus each replica's progress since its snapshot."""
        if self.snapshots is None:
            return
        progress = [[p.detach() - s for p, s in zip(state_tensors(m), snap)]
                    for m, snap in zip(self.replicas, self.snapshots)]
        new = self.meeting_step(average(self.snapshots))
        for m, prog in zip(self.replicas, progress):
            for p, v, d in zip(state_tensors(m), new, prog):
                p.copy_(v + d)
        self.snapshots = None

    @torch.no_grad()
    def meet(self):
        new = self.meeting_step(average([[p.detach() for p in state_tensors(m)]
                                         for m in self.replicas]))
        for m in self.replicas:
            for p, v in zip(state_tensors(m), new):
                p.copy_(v)

    @torch.no_grad()
    def meeting_step(self, avg):
        """What every replica takes from ``avg`` (parameters, then buffers):
        itself, or for the parameters the outer step from the anchor (the
        buffers take the average)."""
        if self.outer is None:
            return avg
        params = list(self.anchor.parameters())
        for a, v in zip(params, avg):
            a.grad = a.detach() - v
        self.outer.step()
        return [a.detach().clone() for a in params] + avg[len(params):]


def train(make_inner, make_outer, period, warmup, what, streaming=False, make_model=mlp):
    model = make_model(1)
    outer = make_outer(model.parameters()) if make_outer else None
    opt = hvd.LocalSGD(make_inner(model.parameters()), model, period=period,
                       outer_optimizer=outer, warmup_steps=warmup, streaming=streaming)
    sim = Simulation(make_inner, make_outer, period, warmup, streaming, make_model)
    worst, meetings = 0.0, 0
    for t in range(STEPS):
        opt.zero_grad()
        loss_of(model, r, t).backward()
        opt.step()
        met = sim.step(t)
        worst = max(worst, check_close(model, sim.replicas[r], f"{what}: step {t}"))
        meetings += met
        if (met and not streaming) or t < warmup:  # (warm-up: buffers stay local)
            same_on_all_ranks(model, f"{what}.{t}", buffers=t >= warmup)
    if meetings != (STEPS - warmup) // period:
        fail(f"{what}: {meetings} meetings in the simulation, expected "
             f"{(STEPS - warmup) // period}")
    opt.synchronize()
    sim.finish_stream()
    if (STEPS - warmup) % period:
        sim.meet()
    worst = max(worst, check_close(model, sim.replicas[r], f"{what}: after synchronize"))
    same_on_all_ranks(model, f"{what}.sync")
    return worst, opt


err_local, _ = train(inner_sgd, None, 4, 0, "local SGD")
err_diloco, _ = train(inner_adamw, outer_nesterov, 6, 0, "DiLoCo")
err_warm, opt = train(inner_adamw, outer_nesterov, 5, 3, "DiLoCo warm-up")
err_stream_local, _ = train(inner_sgd, None, 3, 0, "streaming local SGD", streaming=True)
err_stream, _ = train(inner_adamw, outer_nesterov, 4, 2, "streaming DiLoCo", streaming=True)
# BatchNorm: its running statistics averaged at every meeting, as parameters otherwise
err_bn, _ = train(inner_sgd, None, 4, 0, "local SGD, BatchNorm", make_model=mlp_bn)
err_bn_diloco, _ = train(inner_adamw, outer_nesterov, 3, 2, "DiLoCo, BatchNorm",
                         make_model=mlp_bn)
err_bn_stream, _ = train(inner_adamw, outer_nesterov, 4, 0, "streaming DiLoCo, BatchNorm",
                         streaming=True, make_model=mlp_bn)
if r == 0:
    print(f"local sgd max relative error local {err_local:.3g}, DiLoCo {err_diloco:.3g}, "
          f"warm-up {err_warm:.3g}, streaming local {err_stream_local:.3g}, streaming DiLoCo "
          f"{err_stream:.3g}, BatchNorm {err_bn:.3g} {err_bn_diloco:.3g} {err_bn_stream:.3g}",
          flush=True)

# ---------------------------------------------------------------- state_dict round trip


a = mlp(5)
opt_a = hvd.LocalSGD(inner_adamw(a.parameters()), a, period=3,
                     outer_optimizer=outer_nesterov(a.parameters()))
for t in range(4):  # one meeting, one local step after it
    opt_a.zero_grad()
    loss_of(a, r, t).backward()
    opt_a.step()
b = clone(a)
opt_b = hvd.LocalSGD(inner_adamw(b.parameters()), b, period=3,
                     outer_optimizer=outer_nesterov(b.parameters()))
opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as if from a file
for t in range(4, 9):  # two meetings (after steps 5 and 8)
    for m, o in ((a, opt_a), (b, opt_b)):
        o.zero_grad()
        loss_of(m, r, t).backward()
        o.step()
check_close(b, a, "state_dict round trip", tol=0.0)
same_on_all_ranks(a, "roundtrip")

# ---------------------------------------------------------------- errors

m = mlp(2)
for bad in (0, -1, 2.0, True):
    expect_raises(ValueError, lambda: hvd.LocalSGD(inner_sgd(m.parameters()), m, period=bad),
                  f"period={bad!r}", "period")
expect_raises(ValueError, lambda: hvd.LocalSGD(inner_sgd(m.parameters()), m, period=2,
                                               warmup_steps=-1), "warmup_steps=-1",
              "warmup_steps")
expect_raises(TypeError, lambda: hvd.LocalSGD(object(), m, period=2), "not an optimizer")
expect_raises(ValueError, lambda: hvd.LocalSGD(inner_sgd(m.parameters()), m, period=2,
                                               streaming=1), "streaming=1", "streaming")
expect_raises(TypeError, lambda: hvd.LocalSGD(inner_sgd(m.parameters()), "model", period=2),
              "not a module")
dist = hvd.DistributedOptimizer(inner_sgd(m.parameters()), named_parameters=m.named_parameters())
expect_raises(ValueError, lambda: hvd.LocalSGD(dist, m, period=2), "DistributedOptimizer inner",
              "plain optimizer")
expect_raises(ValueError, lambda: hvd.LocalSGD(
    inner_sgd(m.parameters()), m, period=2,
    outer_optimizer=outer_nesterov(list(m.parameters())[:2])), "outer on a subset",
    "exactly the model's parameters")
same = inner_sgd(m.parameters())
expect_raises(ValueError, lambda: hvd.LocalSGD(same, m, period=2, outer_optimizer=same),
              "outer is inner", "separate")
err = expect_raises(hvd.CollectiveMismatchError, lambda: hvd.LocalSGD(
    inner_sgd(m.parameters()), m, period=2 + r), "period differs across ranks")
if "period" not in str(err):
    fail(f"the mismatch error does not name the options: {err}")
err = expect_raises(hvd.CollectiveMismatchError, lambda: hvd.LocalSGD(
    inner_sgd(m.parameters()), m, period=2, streaming=r == 0), "streaming differs across ranks")
bn = mlp_bn(2)
expect_raises(ValueError, lambda: hvd.LocalSGD(inner_sgd(bn.parameters()), bn, period=2,
                                               average_buffers=1), "average_buffers=1",
              "average_buffers")
err = expect_raises(hvd.CollectiveMismatchError, lambda: hvd.LocalSGD(
    inner_sgd(bn.parameters()), bn, period=2, average_buffers=r == 0),
    "average_buffers differs across ranks")
if "average_buffers" not in str(err):
    fail(f"the mismatch error does not name average_buffers: {err}")

# average_buffers=False: a meeting leaves every rank its own running statistics
bn = mlp_bn(3)
opt = hvd.LocalSGD(inner_sgd(bn.parameters()), bn, period=2, average_buffers=False)
for t in range(2):
    opt.zero_grad()
    loss_of(bn, r, t).backward()
    opt.step()
same_on_all_ranks(bn, "average_buffers=False", buffers=False)
mean = bn[1].running_mean.clone()
every = hvd.allgather(mean.unsqueeze(0), name="bn.own_stats")
if n > 1 and torch.equal(every[0], every[1]):
    fail("average_buffers=False: the running statistics were averaged")
if "streaming" not in str(err):
    fail(f"the mismatch error does not name streaming: {err}")
done()

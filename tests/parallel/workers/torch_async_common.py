"""Shared by the delayed-averaging and local-SGD workers: a small model,
per-rank data from per-rank seeds, and checks against a single-process
simulation that every rank computes from all ranks' data."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import fail

B = 8  # per-rank batch
STEPS = 20


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, 24), nn.Tanh(), nn.Linear(24, 4))


def mlp_bn(seed=0):
    """With a BatchNorm layer: floating-point buffers (running statistics)
    beside an integer one (num_batches_tracked). No bias before the
    normalisation: its gradient would be rounding noise, which Adam turns
    into steps of +-lr whose sign depends on the order of the sums."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, 24, bias=False), nn.BatchNorm1d(24), nn.Tanh(),
                         nn.Linear(24, 4))


def state_tensors(model):
    """The parameters, then the floating-point buffers."""
    return list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=0.01)


def batch(k, step):
    """Rank k's batch at ``step`` (any rank can compute any rank's)."""
    g = torch.Generator().manual_seed(7919 * (k + 1) + step)
    return torch.randn(B, 10, generator=g), torch.randint(0, 4, (B,), generator=g)


def loss_of(model, k, step):
    x, y = batch(k, step)
    return F.cross_entropy(model(x), y)


def grads_of(model, k, step):
    """Rank k's gradients at ``model``'s parameters (None where unused)."""
    for p in model.parameters():
        p.grad = None
    loss_of(model, k, step).backward()
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def average(tensor_lists):
    """Per position, the mean over ranks (zeros for ranks without a tensor);
    None where no rank has one."""
    out = []
    for ts in zip(*tensor_lists):
        have = [t for t in ts if t is not None]
        out.append(None if not have else torch.stack(have).sum(0) / len(ts))
    return out


def rel_err(model, ref):
    worst = 0.0
    for p, q in zip(state_tensors(model), state_tensors(ref)):
        d = (p - q).detach().abs().max() / q.detach().abs().max().clamp_min(1e-12)
        worst = max(worst, float(d))
    return worst


def check_close(model, ref, what, tol=1e-5):
    err = rel_err(model, ref)
    if not err <= tol:
        fail(f"{what}: max relative error {err:.3g} > {tol} against the simulation")
    return err


def same_on_all_ranks(model, what, buffers=True):
    tensors = state_tensors(model) if buffers else list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in tensors])
    every = hvd.allgather(flat.unsqueeze(0), name=f"same.{what}")
    for k in range(hvd.size()):
        if not torch.equal(every[k], flat):
            fail(f"{what}: parameters or buffers differ bitwise between rank {hvd.rank()} and rank {k}")


def clone(model):
    return copy.deepcopy(model)


def step_applies_nothing(model, opt, step, what):
    """One step of this rank's batch with ``opt``; the parameters must not
    change (a delayed step with nothing pending)."""
    before = clone(model)
    opt.zero_grad()
    loss_of(model, hvd.rank(), step).backward()
    opt.step()
    check_close(model, before, what, tol=0.0)

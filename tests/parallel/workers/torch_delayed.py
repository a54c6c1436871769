"""DistributedOptimizer(..., staleness=1) on every rank: after every step the
parameters equal a single-process simulation of the delayed rule
(p_{t+1} = rule(p_t, avg(g_{t-1})), nothing applied at step 0) within 1e-5
and are bitwise identical across ranks; synchronize() applies the pending
average; unused parameters; fp16 compression; error cases."""
import torch
import torch.nn as nn

import commlib.torch as hvd
from _common import done, expect_raises, fail
from torch_async_common import (STEPS, adam, average, check_close, clone, grads_of, loss_of,
                                mlp, same_on_all_ranks, sgd, step_applies_nothing)

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()


def simulate_step(ref, ref_opt, step, pending):
    """One step of the delayed rule on the reference: average all ranks'
    gradients at the current parameters, apply the previous average.
    Returns the new pending average."""
    avg = average([grads_of(ref, k, step) for k in range(n)])
    if pending is not None:
        for p, g in zip(ref.parameters(), pending):
            p.grad = g
        ref_opt.step()
    return avg


def apply_pending(ref, ref_opt, pending):
    for p, g in zip(ref.parameters(), pending):
        p.grad = g
    ref_opt.step()


def train(make_opt, what, tol=1e-5, make_ref=None, **kwargs):
    """Trains with staleness=1 and the simulation side by side, checking
    every step; returns the worst relative error."""
    model, ref = mlp(1), mlp(1)
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters(), staleness=1,
                                   **kwargs)
    ref_opt = (make_ref or make_opt)(ref.parameters())
    start = clone(model)
    pending, worst = None, 0.0
    for step in range(STEPS):
        opt.zero_grad()
        loss_of(model, r, step).backward()
        opt.step()
        pending = simulate_step(ref, ref_opt, step, pending)
        if step == 0:
            if check_close(model, start, f"{what}: step 0", tol=0.0) != 0.0 or opt.state:
                fail(f"{what}: step 0 applied something")
            if not opt.pending or any(p.grad is not None for p in model.parameters()):
                fail(f"{what}: after step 0 an average should be pending and no grad set")
        worst = max(worst, check_close(model, ref, f"{what}: step {step}", tol))
        same_on_all_ranks(model, f"{what}.{step}")
    opt.synchronize()
    apply_pending(ref, ref_opt, pending)
    if opt.pending:
        fail(f"{what}: synchronize() left an average pending")
    worst = max(worst, check_close(model, ref, f"{what}: after synchronize", tol))
    same_on_all_ranks(model, f"{what}.sync")
    # The step after synchronize() applies nothing (its gradient is pending).
    step_applies_nothing(model, opt, STEPS, f"{what}: step after synchronize")
    opt.synchronize()
    apply_pending(ref, ref_opt, average([grads_of(ref, k, STEPS) for k in range(n)]))
    check_close(model, ref, f"{what}: second synchronize", tol)
    return worst


err_sgd = train(sgd, "SGD")
err_adam = train(adam, "Adam")
# Sum: the simulation of Average with the learning rate times n.
err_sum = train(lambda ps: torch.optim.SGD(ps, lr=0.1 / n), "Sum", op=hvd.Sum,
                make_ref=lambda ps: torch.optim.SGD(ps, lr=0.1))
if r == 0:
    print(f"delayed max relative error SGD {err_sgd:.3g}, Adam {err_adam:.3g}, Sum {err_sum:.3g}",
          flush=True)


# ---------------------------------------------------------------- unused parameters

class TwoHeads(nn.Module):
    """``odd`` is used on odd ranks only, ``never`` nowhere."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.body = nn.Linear(10, 4)
        self.odd = nn.Linear(10, 4)
        self.never = nn.Linear(10, 4)
        self.k = 0  # whose batch this is

    def forward(self, x):
        out = self.body(x)
        return out + self.odd(x) if self.k % 2 == 1 else out


def loss_at(model, k, step):
    model.k = k
    return loss_of(model, k, step)


model, ref = TwoHeads(), TwoHeads()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters(), staleness=1)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
never0 = model.never.weight.detach().clone()
pending = None
for step in range(6):
    opt.zero_grad()
    loss_at(model, r, step).backward()
    opt.step()
    per_rank = []
    for k in range(n):
        ref.zero_grad()
        loss_at(ref, k, step).backward()
        per_rank.append([None if p.grad is None else p.grad.clone() for p in ref.parameters()])
    if pending is not None:
        apply_pending(ref, ref_opt, pending)
    pending = average(per_rank)
    check_close(model, ref, f"unused parameters: step {step}")
    same_on_all_ranks(model, f"unused.{step}")
if not torch.equal(model.never.weight, never0) or model.never.weight in opt.state:
    fail("a parameter with a gradient on no rank was updated or got optimizer state")
if model.odd.weight not in opt.state:
    fail("a parameter with a gradient on some ranks only got no update")
opt.synchronize()

# ---------------------------------------------------------------- fp16 compression

err_fp16 = train(sgd, "fp16", tol=2e-2, compression=hvd.Compression.fp16)

# ---------------------------------------------------------------- errors

plain = mlp(2)
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    sgd(plain.parameters()), named_parameters=plain.named_parameters(), staleness=2),
    "staleness=2", "staleness must be 0")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    sgd(plain.parameters()), named_parameters=plain.named_parameters(), staleness=1,
    groups=2), "staleness with groups", "groups")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    sgd(plain.parameters()), named_parameters=plain.named_parameters(), staleness=1,
    op=hvd.Min), "staleness with op=Min", "op=Average or op=Sum")
delayed = hvd.DistributedOptimizer(sgd(plain.parameters()),
                                   named_parameters=plain.named_parameters(), staleness=1)


def clip_step():
    with delayed.skip_synchronize():
        pass


expect_raises(ValueError, clip_step, "skip_synchronize with staleness", "staleness=1")
# staleness differing across ranks: every rank raises, none hangs.
err = expect_raises(hvd.CollectiveMismatchError, lambda: hvd.DistributedOptimizer(
    sgd(plain.parameters()), named_parameters=plain.named_parameters(),
    staleness=1 if r == 0 else 0), "staleness differs across ranks")
if "staleness" not in str(err):
    fail(f"the mismatch error does not name staleness: {err}")
done()

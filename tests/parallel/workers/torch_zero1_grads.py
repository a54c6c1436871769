"""ZeRO stage 1's two paths on every rank, against the unsharded
DistributedOptimizer on the same data and gradients computed here with
torch: ``step()`` alone (reduce-scatter + parameter gather; ``p.grad`` keeps
this rank's own gradient) and ``synchronize()`` first (every ``p.grad`` holds
the averaged gradient, the same on every rank, clipped or not), taking turns
with both kinds of ``zero_grad``, over several buckets with uneven shards."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import done, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
B, STEPS = 5, 12


def net():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(7, 23), nn.Tanh(), nn.Linear(23, 11), nn.Tanh(),
                         nn.Linear(11, 3))


def batch(step):
    g = torch.Generator().manual_seed(50 + step)
    return torch.randn(n * B, 7, generator=g), torch.randint(0, 3, (n * B,), generator=g)


def grads_of(shadow, params, x, y):
    """The gradient of the mean loss on (x, y) at ``params``, computed with a
    plain copy of the model."""
    with torch.no_grad():
        for q, p in zip(shadow.parameters(), params):
            q.copy_(p)
    shadow.zero_grad(set_to_none=True)
    F.cross_entropy(shadow(x), y).backward()
    return [q.grad.clone() for q in shadow.parameters()]


def close(got, want, what, rtol=1e-6):
    for i, (g, w) in enumerate(zip(got, want)):
        if g is None or not torch.allclose(g, w, rtol=rtol, atol=1e-7):
            fail(f"{what}: parameter {i}: {None if g is None else g.reshape(-1)[:4]} != "
                 f"{w.reshape(-1)[:4]}")


def same_everywhere(tensors, what):
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    every = hvd.allgather(flat.unsqueeze(0), name=f"same.{what}")
    if not all(torch.equal(every[i], flat) for i in range(n)):
        fail(f"{what}: differs across ranks")


model, ref, shadow = net(), net(), net()
opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.02),
                               named_parameters=model.named_parameters(), zero_stage=1,
                               bucket_elements=150)
ref_opt = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=0.02),
                                   named_parameters=ref.named_parameters())
if len(opt._buckets) < 3 or not any(b.plan.numel % n for b in opt._buckets if n > 1):
    fail(f"the test should cover several buckets and uneven shards: {len(opt._buckets)}")
params = list(model.parameters())
for step in range(STEPS):
    kind = step % 4  # 0, 2: step() alone; 1: synchronize(); 3: synchronize() and clipping
    set_to_none = step % 3 != 1
    opt.zero_grad(set_to_none=set_to_none)
    ref_opt.zero_grad()
    if set_to_none and any(p.grad is not None for p in params):
        fail(f"step {step}: p.grad is not None after zero_grad()")
    if not set_to_none and any(p.grad is None or p.grad.count_nonzero() for p in params):
        fail(f"step {step}: p.grad is not zero after zero_grad(set_to_none=False)")
    x, y = batch(step)
    mine = slice(r * B, (r + 1) * B)
    local = grads_of(shadow, params, x[mine], y[mine])
    per_rank = [grads_of(shadow, params, x[q * B:(q + 1) * B], y[q * B:(q + 1) * B])
                for q in range(n)]
    average = [sum(gs) / n for gs in zip(*per_rank)]
    F.cross_entropy(model(x[mine]), y[mine]).backward()
    F.cross_entropy(ref(x[mine]), y[mine]).backward()
    if kind in (0, 2):
        opt.step()
        ref_opt.step()
        close([p.grad for p in params], local, f"step {step}: p.grad after step() alone",
              rtol=0.0)
    else:
        opt.synchronize()
        ref_opt.synchronize()
        close([p.grad for p in params], average, f"step {step}: p.grad after synchronize()")
        close([p.grad for p in params], [p.grad for p in ref.parameters()],
              f"step {step}: p.grad after synchronize() against unsharded")
        same_everywhere([p.grad for p in params], f"grad{step}")
        if kind == 3:
            norm = nn.utils.clip_grad_norm_(params, 0.05)
            ref_norm = nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
            if not torch.allclose(norm, ref_norm, rtol=1e-6):
                fail(f"step {step}: gradient norm {norm} != {ref_norm}")
            if float(norm) <= 0.05:
                fail(f"step {step}: the clipping test should clip (norm {float(norm)})")
        clipped = [p.grad.clone() for p in params]
        with opt.skip_synchronize():
            opt.step()
        with ref_opt.skip_synchronize():
            ref_opt.step()
        close([p.grad for p in params], clipped, f"step {step}: p.grad after the step",
              rtol=0.0)
    err = max(float((p - q).abs().max() / q.abs().max())
              for p, q in zip(params, ref.parameters()))
    if err > 1e-5:
        fail(f"step {step} (kind {kind}): parameters {err:.3g} from unsharded")
    same_everywhere(params, f"param{step}")
opt.zero_grad()  # p.grad None; the flat gradient (made by synchronize()) and the
# shard gradient stay allocated: the report counts them
grads = hvd.memory_report(model, opt)["gradients"]
if grads != 4 * sum(b.plan.padded + b.plan.shard for b in opt._buckets):
    fail(f"memory_report gradients {grads} after zero_grad(): the flat gradients are not counted")
print(f"rank {r}: stage 1 paths checked over {STEPS} steps", flush=True)
done()

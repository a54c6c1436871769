"""Autotune (COMMLIB_AUTOTUNE=1, a small search budget set by the test) under
commlib.torch's DistributedOptimizer: every step the model equals a local
reference trained on every rank's batch (the average of their gradients);
every rank applies the same settings after the same collectives, and the
search ends at the best-scored setting of rank 0's CSV log (argument 1)."""
import copy
import sys

import torch
import torch.nn as nn

import commlib.torch as hvd
from _common import done, fail
from autotune_common import check_log, check_same_everywhere, history, run_until_final

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
reference = copy.deepcopy(model)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)


def batch(k, q):
    g = torch.Generator().manual_seed(1000 * k + q)
    return torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)


def step(k):
    x, y = batch(k, r)
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    ref_opt.zero_grad()
    (sum(nn.functional.mse_loss(reference(xq), yq) for xq, yq in map(lambda q: batch(k, q), range(n))) / n).backward()
    ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if not torch.allclose(p, q, rtol=1e-4, atol=1e-5):
            fail(f"step {k}: {name} differs from the reference by {(p - q).abs().max().item():.3g}")


steps = run_until_final(step, 400)
hist = history()
check_same_everywhere(hist)
if hist[-1, 4] != 1 or hist[:-1, 4].any():
    fail(f"the final setting is not last, or not alone: {hist.tolist()}")
if r == 0:
    check_log(sys.argv[1], hist, (0, 1000, 16384))
print(f"rank {r}: {steps} steps, settings {hist.tolist()}", flush=True)
done()

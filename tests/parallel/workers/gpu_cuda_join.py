"""Run by tests/gpu: uneven data on a CUDA model. The last rank has half the
batches and calls join() early; the others go on with DistributedOptimizer,
the joined rank standing in for their CUDA allreduces on its GPU (zeros;
Average still divides by every rank). The same training on CPU tensors (the
CPU path's join) must give the same parameters after broadcast_parameters
from the rank join() returns."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpu_common import DEVICE
import commlib.torch as hvd
from _common import done, fail

hvd.init()
r, n = hvd.rank(), hvd.size()
STEPS = 4 if r == n - 1 else 8


def train(device):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + r)
        x, y = torch.randn(8, 8, generator=g).to(device), torch.randint(0, 4, (8,), generator=g).to(device)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    last = hvd.join()
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    return [p.detach().cpu() for p in model.parameters()], last


cuda_params, cuda_last = train(DEVICE)
cpu_params, cpu_last = train(torch.device("cpu"))
for last in (cuda_last, cpu_last):  # (which of the ranks with more batches joins last is timing)
    if not 0 <= last < n - 1:
        fail(f"join() returned {last}: expected a rank that had more batches than rank {n - 1}")
worst = max((a - b).abs().max().item() for a, b in zip(cuda_params, cpu_params))
if worst > 1e-5:
    fail(f"CUDA training with a joined rank differs from the CPU path by {worst:.3g}")
print(f"rank {r}: join on CUDA: last {cuda_last}, largest difference {worst:.3g}", flush=True)
done()

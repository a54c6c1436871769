"""Run by tests/gpu: DistributedOptimizer on a CUDA model, each rank on its
shard of every batch, ends within 1e-5 of one process training on the whole
batches (computed here too, on the same GPU) after 20 steps; broadcast_parameters
and broadcast_optimizer_state on CUDA tensors (a trained one's momentum stays on
the device)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpu_common import DEVICE
import commlib.torch as hvd
from _common import done, fail

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(0)
BATCH, STEPS = 16 * n, 20


def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)).to(DEVICE)


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 8, generator=g).to(DEVICE), torch.randint(0, 4, (BATCH,), generator=g).to(DEVICE)


dist, ref = model(), model()
with torch.no_grad():  # ranks start apart; broadcast_parameters makes them equal
    for p in dist.parameters():
        p.add_(r)
hvd.broadcast_parameters(dist.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(dist.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=dist.named_parameters())
hvd.broadcast_optimizer_state(opt, root_rank=0)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
with torch.no_grad():  # rank 0's start (+0) is the reference's
    for p, q in zip(dist.parameters(), ref.parameters()):
        if not torch.equal(p, q):
            fail("broadcast_parameters did not give rank 0's parameters")
for step in range(STEPS):
    x, y = batch(step)
    opt.zero_grad()
    F.cross_entropy(dist(x[r::n]), y[r::n]).backward()
    opt.step()
    ref_opt.zero_grad()
    F.cross_entropy(ref(x), y).backward()
    ref_opt.step()
worst = max((p - q).abs().max().item() for p, q in zip(dist.parameters(), ref.parameters()))
if worst > 1e-5:
    fail(f"after {STEPS} steps the parameters differ from one process by {worst:.3g}")
print(f"rank {r}: largest difference {worst:.3g}", flush=True)
# Momentum buffers (CUDA tensors, now set apart per rank) travel as device
# tensors, fused, and arrive on this rank's device equal to rank 0's.
with torch.no_grad():
    for state in opt.state.values():
        state["momentum_buffer"].add_(r)
hvd.broadcast_optimizer_state(opt, root_rank=0)
buffers = [opt.state[p]["momentum_buffer"] for p in dist.parameters()]
if any(b.device != DEVICE for b in buffers):
    fail(f"broadcast_optimizer_state moved the momentum off {DEVICE}: {[str(b.device) for b in buffers]}")
first = hvd.broadcast(torch.cat([b.flatten() for b in buffers]), root_rank=0, name="momentum.check")
if not torch.equal(first, torch.cat([b.flatten() for b in buffers])):
    fail("broadcast_optimizer_state did not give rank 0's momentum buffers")
done()

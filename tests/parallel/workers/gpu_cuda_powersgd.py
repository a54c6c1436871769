"""Run by tests/gpu: DistributedOptimizer(compression=Compression.powersgd(...))
on a CUDA model (the products on the GPU, the allreduces through NCCL) trains
as the same optimizer on a CPU copy of the model, in the same job, within
1e-9 over 20 steps (float64, plain steps then compressed ones); its error
buffers and Q stay on the GPU and the replicas are bitwise identical."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpu_common import DEVICE
import commlib.torch as hvd
from _common import done, fail

hvd.init()
r, n = hvd.rank(), hvd.size()
B, STEPS = 8, 20
torch.backends.cuda.matmul.allow_tf32 = False


def make(device):
    torch.manual_seed(1)
    # 32x10 and 16x32 weights are compressed at rank 2; the head and biases are not
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 16), nn.Tanh(),
                          nn.Linear(16, 4)).double().to(device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.powersgd(rank=2, start_step=4))
    return model, opt


def step(model, opt, s, device):
    g = torch.Generator().manual_seed(1000 + 10 * s)
    x, y = torch.randn(n * B, 10, generator=g).double(), torch.randint(0, 4, (n * B,), generator=g)
    opt.zero_grad()
    F.cross_entropy(model(x[r * B:(r + 1) * B].to(device)), y[r * B:(r + 1) * B].to(device)).backward()
    opt.step()


cuda, cuda_opt = make(DEVICE)
cpu, cpu_opt = make("cpu")
for s in range(STEPS):
    step(cuda, cuda_opt, s, DEVICE)
    step(cpu, cpu_opt, s, "cpu")
    flat = torch.cat([p.detach().reshape(-1) for p in cuda.parameters()])
    every = hvd.allgather(flat.unsqueeze(0), name=f"same.{s}")
    if not all(torch.equal(row, flat) for row in every):
        fail(f"the CUDA replicas differ bitwise after step {s}")
worst = max(((p.detach().cpu() - q.detach()).abs().max() / q.detach().abs().max()).item()
            for p, q in zip(cuda.parameters(), cpu.parameters()))
print(f"rank {r}: largest relative difference from the CPU run {worst:.3g}", flush=True)
if worst > 1e-9:
    fail(f"PowerSGD on CUDA differs from the CPU run by {worst:.3g} after {STEPS} steps")
state = cuda_opt.state_dict()["powersgd"]
placed = {str(t.device) for key in ("errors", "qs") for t in state[key].values()}
if sorted(state["errors"]) != ["0.weight", "2.weight"] or placed != {str(DEVICE)}:
    fail(f"PowerSGD's state on CUDA: errors of {sorted(state['errors'])}, on {placed}")
done()

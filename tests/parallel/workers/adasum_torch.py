"""op=Adasum in commlib.torch: allreduce / allreduce_ / grouped_allreduce
against adasum_reference, its gradient, integer dtypes refused; then
DistributedOptimizer(op=Adasum) (SGD with momentum, Adam; float64) on each
rank's own batch: after every step the replicas are bitwise identical and
match a simulation that steps a copy of every rank's optimizer on that rank's
batch from the shared parameters and sets them to old + adasum(deltas)."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import check_equal, done, expect_raises, fail
from adasum_reference import adasum

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
B, STEPS = 6, 5


def rank_tensor(q, shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(100 * seed + q)
    return (torch.randn(shape, generator=g, dtype=torch.float64) + 0.3 * q).to(dtype)


# ---- collectives
for dtype, tol in ((torch.float64, 1e-6), (torch.float32, 1e-5)):
    xs = [rank_tensor(q, (4, 5), dtype, seed=1) for q in range(n)]
    want = adasum([x.double().numpy() for x in xs])
    got = hvd.allreduce(xs[r], op=hvd.Adasum, name=f"t.{dtype}")
    check_equal(got.double().numpy(), want, f"allreduce Adasum {dtype}", rtol=tol, atol=tol)
    mine = xs[r].clone()
    hvd.allreduce_(mine, op=hvd.Adasum, name=f"t_.{dtype}")
    if not torch.equal(mine, got):
        fail(f"allreduce_ Adasum {dtype} differs from allreduce")
sizes = [(3,), (50,), (2, 2)]
groups = [[rank_tensor(q, s, seed=10 + i) * (10.0 ** i) for q in range(n)]
          for i, s in enumerate(sizes)]
outs = hvd.grouped_allreduce([g[r] for g in groups], op=hvd.Adasum, name="grouped")
for i, (o, g) in enumerate(zip(outs, groups)):
    check_equal(o.numpy(), adasum([x.numpy() for x in g]), f"grouped Adasum tensor {i}",
                rtol=1e-6, atol=1e-6 * float(np.abs(o.numpy()).max()))
# gradient (Horovod's: the Adasum of the output gradients, the same on every rank)
x = rank_tensor(r, (6,), seed=3).requires_grad_()
hvd.allreduce(x, op=hvd.Adasum, name="grad.fwd").sum().backward()
check_equal(x.grad.numpy(), np.ones(6), "gradient of allreduce Adasum")
expect_raises(TypeError, lambda: hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum),
              "Adasum of int32", match="Adasum")
expect_raises(TypeError, lambda: hvd.grouped_allreduce([torch.ones(2), torch.ones(2, dtype=torch.int64)],
                                                       op=hvd.Adasum), "grouped Adasum of int64",
              match="Adasum")


# ---- DistributedOptimizer(op=Adasum) against a simulation
def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).double()


def batch(step, q):
    g = torch.Generator().manual_seed(1000 * step + q)
    return torch.randn(B, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (B,), generator=g)


def loss_of(model, step, q):
    x, y = batch(step, q)
    return F.cross_entropy(model(x), y)


def train_and_compare(make_opt, what):
    model = mlp()
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    sims = [mlp() for _ in range(n)]  # every rank's replica, each with its own optimizer state
    sim_opts = [make_opt(m.parameters()) for m in sims]
    shared = [p.detach().clone() for p in mlp().parameters()]
    worst = 0.0
    for step in range(STEPS):
        opt.zero_grad()
        loss_of(model, step, r).backward()
        opt.step()
        deltas = []
        for m, o, q in zip(sims, sim_opts, range(n)):
            with torch.no_grad():
                for p, s in zip(m.parameters(), shared):
                    p.copy_(s)
            o.zero_grad()
            loss_of(m, step, q).backward()
            o.step()
            deltas.append([(p.detach() - s).numpy() for p, s in zip(m.parameters(), shared)])
        shared = [s + torch.from_numpy(adasum([d[i] for d in deltas]))
                  for i, s in enumerate(shared)]
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        every = hvd.allgather(flat.unsqueeze(0), name=f"same.{what}.{step}")
        if not all(torch.equal(every[k], flat) for k in range(n)):
            fail(f"{what}: replicas differ after step {step}")
        want = torch.cat([s.reshape(-1) for s in shared])
        worst = max(worst, float((flat - want).abs().max() / want.abs().max()))
    if worst > 1e-9:
        fail(f"{what}: the parameters left the simulation (max relative error {worst:.3g})")
    return worst


errors = {"SGD": train_and_compare(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "SGD"),
          "Adam": train_and_compare(lambda ps: torch.optim.Adam(ps, lr=0.01), "Adam")}
print(f"rank {r}: Adasum optimizer max relative error SGD {errors['SGD']:.3g}, "
      f"Adam {errors['Adam']:.3g}", flush=True)
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    torch.optim.SGD(mlp().parameters(), lr=0.1), op=hvd.Adasum, staleness=1), "Adasum staleness")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    torch.optim.SGD(mlp().parameters(), lr=0.1), op=hvd.Adasum, zero_stage=1), "Adasum ZeRO")
done()

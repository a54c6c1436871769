"""DistributedOptimizer on sparse gradients, on every rank: SparseAdam (and
SGD) on nn.Embedding(sparse=True) train with sparse_as_dense=True and False
alike; after every step the replicas are bitwise identical and within 1e-5
of one process trained on the combined batch. With sparse_as_dense=True the
optimizer gets a sparse gradient back, holding exactly the rows some rank
touched: some samples carry zero weight, so rows touched only by them have
a zero gradient that still moves SparseAdam's moments, as in one process.
Prints the largest relative error."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import done, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
B, ROWS, STEPS = 4, 24, 6


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.emb = nn.Embedding(ROWS, 3, sparse=True)
        self.out = nn.Linear(3, 1)

    def forward(self, idx, weight):
        return self.out(self.emb(idx).mean(1)).squeeze(1) * weight


def combined(step):
    """The combined batch of all ranks (the same everywhere). Every third
    sample weighs 0 and touches a special row; at even steps a weighted
    sample touches it too, at odd steps only weightless ones do: its
    gradient is then zero, yet SparseAdam's moments from the step before
    move it."""
    g = torch.Generator().manual_seed(40 + step)
    idx = torch.randint(0, ROWS - 8, (n * B, 2), generator=g)
    special = ROWS - 8 + step // 2
    idx[::3, 1] = special
    if step % 2 == 0:
        idx[1, 1] = special
    weight = torch.ones(n * B)
    weight[::3] = 0.0
    return idx, weight, torch.randn(n * B, generator=g)


def mine(t):
    return t[r * B:(r + 1) * B]


def rel_err(model, ref):
    return max(float((p - q).detach().abs().max() / q.detach().abs().max())
               for p, q in zip(model.parameters(), ref.parameters()))


def same_everywhere(model, what):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if not all(torch.equal(e, flat) for e in hvd.allgather(flat[None], name=f"same.{what}")):
        fail(f"{what}: replicas differ")


OPTIMIZERS = {"SparseAdam": lambda m: torch.optim.SparseAdam([m.emb.weight], lr=0.05),
              "SGD": lambda m: torch.optim.SGD([m.emb.weight], lr=0.5)}
worst = 0.0
for name, make in OPTIMIZERS.items():
    for sparse_as_dense in (False, True):
        what = f"{name} sparse_as_dense={sparse_as_dense}"
        model, ref = Model(), Model()
        opt = hvd.DistributedOptimizer(make(model), named_parameters=[("emb", model.emb.weight)],
                                       sparse_as_dense=sparse_as_dense)
        ref_opt = make(ref)
        for step in range(STEPS):
            idx, weight, target = combined(step)
            opt.zero_grad()
            F.mse_loss(model(mine(idx), mine(weight)), mine(target)).backward()
            opt.synchronize()
            if not model.emb.weight.grad.is_sparse:
                fail(f"{what}: the optimizer got a dense gradient")
            with opt.skip_synchronize():
                opt.step()
            ref_opt.zero_grad()
            F.mse_loss(ref(idx, weight), target).backward()
            ref_opt.step()
            same_everywhere(model, f"{what} step {step}")
            err = rel_err(model.emb, ref.emb)
            if err > 1e-5:
                fail(f"{what} step {step}: relative error {err:.3g} against one process")
            worst = max(worst, err)
print(f"rank {r}: sparse max relative error {worst:.3g}", flush=True)
done()

"""fully_shard's root pattern on every rank: fully_shard on each layer, then
on an nn.Sequential that owns no parameters of its own (it drives the
layers: prefetching follows their order), and a deeper tree whose inner
containers own nothing and whose root owns a head of its own; 8 Adam steps
each within 1e-5 relative of the unsharded DistributedOptimizer.
Prints the largest relative error."""
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import done, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
B, STEPS = 4, 8


def flat_net():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 10), nn.Tanh(),
                         nn.Linear(10, 3))


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.body = nn.Sequential(nn.Sequential(nn.Sequential(nn.Linear(6, 8), nn.Tanh()),
                                                nn.Linear(8, 8)), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)))


def shard_flat(model):
    for layer in model:
        if isinstance(layer, nn.Linear):
            hvd.fully_shard(layer)
    return hvd.fully_shard(model)  # owns nothing


def shard_deep(model):
    for m in list(model.modules()):
        if isinstance(m, nn.Linear) and m is not model.head:
            hvd.fully_shard(m)
    inner = [model.body[0][0], model.body[0], model.body]  # innermost first: all own nothing
    for m in inner:
        hvd.fully_shard(m)
    return hvd.fully_shard(model)  # owns the head


def batch(step):
    g = torch.Generator().manual_seed(90 + step)
    x, y = torch.randn(n * B, 6, generator=g), torch.randint(0, 3, (n * B,), generator=g)
    return x[r * B:(r + 1) * B], y[r * B:(r + 1) * B]


def train(model, opt):
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


worst = 0.0
for what, make, shard in (("Sequential root", flat_net, shard_flat), ("deep tree", Deep, shard_deep)):
    ref = make()
    train(ref, hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=1e-2),
                                        named_parameters=ref.named_parameters()))
    model = shard(make())
    groups = [m._commlib_fsdp for m in model.modules() if getattr(m, "_commlib_fsdp", None)]
    if len(list(model.parameters())) != len(groups):
        fail(f"{what}: {len(list(model.parameters()))} shards for {len(groups)} sharded modules")
    train(model, torch.optim.Adam(model.parameters(), lr=1e-2))
    with hvd.full_parameters(model):
        for name, q in ref.named_parameters():
            p = functools.reduce(getattr, name.split("."), model)
            worst = max(worst, float((p - q).detach().abs().max() / q.detach().abs().max()))
    if worst > 1e-5:
        fail(f"{what}: relative error {worst} against unsharded after {STEPS} steps")
    used = [g.prefetches_used for g in groups]
    if what == "Sequential root" and min(used) < STEPS - 1:  # the root prefetches the first layer
        fail(f"{what}: prefetched gathers unused: {used}")
print(f"rank {r}: root max relative error {worst:.3g}", flush=True)
done()

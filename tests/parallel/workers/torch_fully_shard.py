"""fully_shard (ZeRO stage 3) on every rank: 20 Adam steps of a model whose
blocks and root are sharded (one block keeps its parameters gathered after
forward) against the unsharded DistributedOptimizer; shards only in
model.parameters(); full_parameters reads and writes back; a sharded
parameter read outside forward raises; memory_report; errors."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import done, expect_raises, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
B, STEPS = 6, 20


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 33), nn.Tanh(), nn.Linear(33, 17), nn.Tanh(),
                         nn.Linear(17, 4))


def batch(step):
    g = torch.Generator().manual_seed(300 + step)
    x, y = torch.randn(n * B, 10, generator=g), torch.randint(0, 4, (n * B,), generator=g)
    return x[r * B:(r + 1) * B], y[r * B:(r + 1) * B]


def train(model, opt, steps=STEPS):
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


ref = net()
ref_opt = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=1e-2),
                                   named_parameters=ref.named_parameters())
train(ref, ref_opt)

model = net()
hvd.fully_shard(model[0])
hvd.fully_shard(model[2], reshard_after_forward=False)
hvd.fully_shard(model)  # the root takes model[4]
psi = sum(p.numel() for p in net().parameters())
shards = list(model.parameters())
if len(shards) != 3 or sum(p.numel() for p in shards) > psi // n + 3 * n:
    fail(f"model.parameters() should be 3 shards of about {psi // n} elements in all: "
         f"{[p.numel() for p in shards]}")
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
train(model, opt)
e = expect_raises(AttributeError, lambda: model[0].weight, "sharded parameter outside forward",
                  match="full_parameters")
rep = hvd.memory_report(model, opt)
if rep["optimizer_state"] > 1.05 * 8 * psi / n + 64 or rep["parameters"] > 1.05 * 4 * psi / n + 64:
    fail(f"memory_report of fully_shard: {rep} for {psi} parameters on {n} ranks")
worst = 0.0
with hvd.full_parameters(model):
    for (name, q), (_, p) in zip(ref.named_parameters(),
                                 [(k, getattr(model[int(k[0])], k[2:])) for k, _ in
                                  ref.named_parameters()]):
        worst = max(worst, float((p - q).detach().abs().max() / q.detach().abs().max()))
    model[4].bias.add_(1.0)  # written back into the shards on exit
print(f"rank {r}: fully_shard max relative error {worst:.3g}", flush=True)
if worst > 1e-5:
    fail(f"fully_shard after {STEPS} Adam steps: relative error {worst} against unsharded")
with hvd.full_parameters(model):
    if not torch.allclose(model[4].bias, ref[4].bias.detach() + 1.0, rtol=1e-5, atol=1e-6):
        fail("full_parameters did not write the change back")
# eval under no_grad works and leaves nothing gathered
with torch.no_grad():
    out = model(batch(0)[0])
with hvd.full_parameters(model):
    want = torch.func.functional_call(net(), {k: getattr(model[int(k[0])], k[2:]).clone()
                                              for k, _ in net().named_parameters()},
                                      (batch(0)[0],))
if not torch.allclose(out, want, rtol=1e-5, atol=1e-6):
    fail("no_grad forward of a fully_shard model differs from the gathered parameters")
expect_raises(AttributeError, lambda: model[0].weight, "after eval", match="full_parameters")
expect_raises(ValueError, lambda: hvd.fully_shard(model), "twice", match="already")
expect_raises(ValueError, lambda: hvd.fully_shard(nn.ReLU()), "no parameters",
              match="no parameters")
mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
expect_raises(TypeError, lambda: hvd.fully_shard(mixed), "mixed dtypes", match="dtype")
done()

"""fully_shard's prefetching on every rank: a model of four sharded blocks
(one keeping its parameters after forward) and a sharded root, trained with
a block skipped every third step (a prefetched gather then goes unused),
a shard changed in place between steps, and a forward that raises: the
shards stay bitwise equal to the same training with prefetch=False and
within 1e-5 of the unsharded DistributedOptimizer; prefetched gathers were
used in forward and in backward."""
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import done, expect_raises, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
B, STEPS = 5, 12


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.blocks = nn.ModuleList(nn.Linear(12, 12) for _ in range(4))
        self.head = nn.Linear(12, 3)

    def forward(self, x, skip=None):
        for i, b in enumerate(self.blocks):
            if i != skip:
                x = torch.tanh(b(x))
        return self.head(x)


def batch(step):
    g = torch.Generator().manual_seed(70 + step)
    x, y = torch.randn(n * B, 12, generator=g), torch.randint(0, 3, (n * B,), generator=g)
    return x[r * B:(r + 1) * B], y[r * B:(r + 1) * B]


def sharded(prefetch):
    model = Net()
    for i, b in enumerate(model.blocks):
        hvd.fully_shard(b, reshard_after_forward=i != 1, prefetch=prefetch)
    hvd.fully_shard(model, prefetch=prefetch)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def train(model, opt, bump):
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x, skip=2 if step % 3 == 1 else None), y).backward()
        opt.step()
        if step == 4:  # block 2 was skipped: its prefetched gather went unused
            with torch.no_grad():
                bump(model)
        if step == 8:
            expect_raises(RuntimeError, lambda: model(torch.randn(2, 5)), "a forward that raises")


def bump_sharded(model):
    model.blocks[2]._commlib_flat_shard.add_(0.01)  # every rank's part: the whole block


def bump_plain(model):
    for p in model.blocks[2].parameters():
        p.add_(0.01)


ref = Net()
ref_opt = hvd.DistributedOptimizer(torch.optim.Adam(ref.parameters(), lr=1e-2),
                                   named_parameters=ref.named_parameters())
train(ref, ref_opt, bump_plain)

on, on_opt = sharded(True)
train(on, on_opt, bump_sharded)
off, off_opt = sharded(False)
train(off, off_opt, bump_sharded)

for (name, a), b in zip(on.named_parameters(), off.parameters()):
    if not torch.equal(a, b):
        fail(f"shard {name}: prefetch=True differs from prefetch=False")
groups = [m._commlib_fsdp for m in on.modules() if getattr(m, "_commlib_fsdp", None)]
used = {g.name: g.prefetches_used for g in groups}
# forward (from the second step): the root prefetches block 0, block 0 not block 1 (it keeps
# its parameters), block 1 block 2 (when not skipped), block 2 block 3; backward: the root
# block 3 (after its first backward), block 3 block 2
if used["fsdp0"] < STEPS - 1 or used["fsdp3"] < STEPS or used["fsdp2"] < STEPS // 2:
    fail(f"prefetched gathers were hardly used: {used}")
if any(m._commlib_fsdp.prefetches_used for m in off.modules()
       if getattr(m, "_commlib_fsdp", None)):
    fail("prefetch=False prefetched")
worst = 0.0
with hvd.full_parameters(on):
    for name, q in ref.named_parameters():
        p = functools.reduce(getattr, name.split("."), on)  # (blocks.0.weight, ...)
        worst = max(worst, float((p - q).detach().abs().max() / q.detach().abs().max()))
print(f"rank {r}: prefetch max relative error {worst:.3g}, prefetches used {used}", flush=True)
if worst > 1e-5:
    fail(f"prefetching fully_shard after {STEPS} steps: relative error {worst} against unsharded")
done()

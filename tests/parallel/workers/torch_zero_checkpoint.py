"""Sharded checkpoints across world sizes, on every rank.

    torch_zero_checkpoint.py save DIR:STAGE ...   K Adam steps, save_sharded(DIR)
    torch_zero_checkpoint.py load DIR:STAGE ...   load_sharded(DIR) into another
        model (another seed, another bucket size), K more steps

(each DIR:STAGE in turn, with a model and optimizer of its own)

STAGE 1 or 2: a ZeRO DistributedOptimizer; 3: fully_shard on the two layers
(the frozen parameter and the buffer stay whole) and plain Adam over the shards.

The model is float64, so that the distributed runs agree with one process on
the combined batch to rounding (1e-12) and the 1e-6 target measures the
resharding, not the reduction order. After loading: the parameters against
an uninterrupted single-process run of 2K steps, the model's buffer and
frozen parameter, identity across ranks, full_state_dict continued in a plain
optimizer, errors."""
import functools
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import done, expect_raises, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
phase, cases = sys.argv[1], [(d, int(k)) for d, k in (a.rsplit(":", 1) for a in sys.argv[2:])]
G, K = 12, 6  # global batch rows (divisible by 2 and 3), steps on each side of the checkpoint


class Net(nn.Module):
    def __init__(self, seed, extra=False):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(10, 33)
        self.b = nn.Linear(33, 4)
        self.frozen = nn.Parameter(torch.randn(4), requires_grad=False)
        self.register_buffer("calls", torch.zeros((), dtype=torch.float64))
        self.extra = nn.Linear(4, 4) if extra else None
        self.double()

    def forward(self, x):
        self.calls += 1
        y = self.b(torch.tanh(self.a(x))) + self.frozen
        return self.extra(y) if self.extra is not None else y


def adam(model):
    return torch.optim.Adam([{"params": model.a.parameters()},
                             {"params": [p for k, p in model.named_parameters()
                                         if k.startswith(("b.", "extra."))], "lr": 3e-3}],
                            lr=1e-2)


def batch(step):
    g = torch.Generator().manual_seed(500 + step)
    return torch.randn(G, 10, generator=g, dtype=torch.float64), torch.randint(0, 4, (G,), generator=g)


def run(model, opt, steps, start, local=False):
    rows = G // (1 if local else n)
    for step in range(start, start + steps):
        x, y = batch(step)
        if not local:
            x, y = x[r * rows:(r + 1) * rows], y[r * rows:(r + 1) * rows]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def zero(model, bucket, stage):
    if stage == 3:
        for layer in (model.a, model.b) + ((model.extra,) if model.extra is not None else ()):
            hvd.fully_shard(layer)
        return adam(model)
    return hvd.DistributedOptimizer(adam(model), named_parameters=model.named_parameters(),
                                    zero_stage=stage, bucket_elements=bucket)


NAMES = list(Net(0).state_dict())  # (the whole model's entries, in order)


def whole_state(model, stage) -> dict:
    """The model's state dict with every parameter whole."""
    if stage != 3:
        return model.state_dict()
    with hvd.full_parameters(model):
        out = {k: functools.reduce(getattr, k.split("."), model).detach().clone()
               for k in NAMES}
    return out


def rel_err(a, b, stage):
    return max(float((p - q).abs().max() / q.abs().max())
               for p, q in zip(whole_state(a, stage).values(), b.state_dict().values()))


def save(directory, stage):
    ref = Net(0)
    ref_opt = adam(ref)
    model = Net(0)
    opt = zero(model, 150, stage)
    run(model, opt, K, 0)
    run(ref, ref_opt, K, 0, local=True)
    if rel_err(model, ref, stage) > 1e-9:
        fail(f"before saving: {rel_err(model, ref, stage)} from one process")
    hvd.save_sharded(directory, model, opt)


def load(directory, stage):
    ref = Net(0)
    ref_opt = adam(ref)
    run(ref, ref_opt, 2 * K, 0, local=True)
    model = Net(1)
    opt = zero(model, 400, stage)
    hvd.load_sharded(directory, model, opt)
    if float(model.calls) != K or not torch.equal(model.frozen, Net(0).frozen):
        fail(f"model buffer/frozen parameter not restored: calls {float(model.calls)}")
    run(model, opt, K, K)
    err = rel_err(model, ref, stage)
    print(f"rank {r}: resumed relative error {err:.3g}", flush=True)
    if err > 1e-6:
        fail(f"resumed at {n} ranks, stage {stage}: {err} from the uninterrupted run")
    flat = torch.cat([p.detach().reshape(-1) for p in whole_state(model, stage).values()])
    if not all(torch.equal(row, flat) for row in hvd.allgather(flat.unsqueeze(0))):
        fail("parameters differ across ranks after loading")
    other = Net(0, extra=True)
    expect_raises(KeyError, lambda: hvd.load_sharded(directory, other, zero(other, 400, stage)),
                  "a parameter the checkpoint lacks", match="not in the saved layout")
    expect_raises(FileNotFoundError, lambda: hvd.load_sharded(directory + "-none", model, opt),
                  "missing directory", match="save_sharded")
    full = hvd.full_state_dict(model, opt, root=0)
    if (full is None) != (r != 0):
        fail(f"full_state_dict(root=0) on rank {r}: {type(full)}")
    if n > 1:  # a root outside the job on rank 1 alone: raised there after its part is gathered
        if r == 1:
            expect_raises(ValueError, lambda: hvd.full_state_dict(model, opt, root=n + 3),
                          "full_state_dict, a bad root on rank 1", match="outside the job")
        elif (hvd.full_state_dict(model, opt, root=0) is None) != (r != 0):
            fail(f"full_state_dict(root=0) on rank {r}, rank 1's root bad: wrong result")
    run(model, opt, 1, 2 * K)
    after = {k: v.clone() for k, v in whole_state(model, stage).items()}  # (collective for stage 3)
    if r == 0:
        plain = Net(2)
        plain_opt = adam(plain)
        plain.load_state_dict(full["model"])
        plain_opt.load_state_dict(full["optimizer"])
        run(plain, plain_opt, 1, 2 * K, local=True)
        err = max(float((plain.state_dict()[k] - v).abs().max() / v.abs().max())
                  for k, v in after.items())
        if err > 1e-9:
            fail(f"full_state_dict continued in plain Adam: {err}")
    expect_raises(TypeError, lambda: hvd.full_state_dict(ref, ref_opt), "plain optimizer",
                  match="zero_stage")


for directory, stage in cases:
    (save if phase == "save" else load)(directory, stage)
done()

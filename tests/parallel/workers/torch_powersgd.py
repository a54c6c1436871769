"""commlib.torch.DistributedOptimizer(compression=Compression.powersgd(...)),
on every rank: 20 steps of a small MLP (start_step a few steps in) match a
float64 simulation of PowerSGD written here independently (every rank's
gradients computed in this process from every rank's data) within 1e-9, and
the replicas are bitwise identical after every step (float64 models, so that
only the order of the sums differs); variants: cold start without error
feedback, backward_passes_per_step=2, op=Sum; at 3 ranks, process sets {0, 2}
and {1, 2} (members match the simulation on their data, the rank outside
trains alone). A float32 checkpoint at step 7
restored into a fresh model and optimizer continues bitwise as the
uninterrupted run, and so does an elastic TorchState restored and synced
from rank 0 (each rank keeps its own error buffers); a bfloat16 model trains with identical replicas; the error
buffers are reused from step to step (no new allocations).
Refused: staleness, zero_stage, groups, sparse gradients, PowerSGD on a
single collective, different ranks across ranks."""
import io

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from commlib import CollectiveMismatchError
from _common import done, expect_raises, fail
from powersgd_reference import exchange
from torch_async_common import same_on_all_ranks

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
B = 8  # per-rank batch
STEPS = 20
LR, MOMENTUM = 0.1, 0.9


def mlp(seed=0):
    torch.manual_seed(seed)
    # 32x10 and 16x32 weights shrink >= 2x at rank 2; the 4x16 head and the biases do not
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 16), nn.Tanh(),
                         nn.Linear(16, 4))


def batch(step, micro=0):
    """The combined batch of all ranks (the same on every rank)."""
    g = torch.Generator().manual_seed(1000 + 10 * step + micro)
    return torch.randn(n * B, 10, generator=g), torch.randint(0, 4, (n * B,), generator=g)


def part(t, k):
    return t[k * B:(k + 1) * B]


# ------------------------------------------------------------ the simulation


def simulate(rank, start, steps, warm=True, feedback=True, passes=1, total=False, seed=0,
             members=None):
    """Parameters (float64 numpy, by name) after every step of PowerSGD
    training on the data of all ranks (or of the ranks ``members``), computed
    in this one process."""
    members = list(range(n)) if members is None else members
    model = mlp().double()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    names = sorted(name for name, _ in model.named_parameters())
    errors = [{} for _ in members]
    qs = {}
    history = []
    for step in range(steps):
        grads = []
        for k in members:
            model.zero_grad()
            for micro in range(passes):
                x, y = batch(step, micro)
                F.cross_entropy(model(part(x, k).double()), part(y, k)).backward()
            grads.append({name: p.grad.numpy().copy() for name, p in model.named_parameters()})
        new = exchange([{i: g[name] for i, name in enumerate(names)} for g in grads], errors,
                       qs, step, rank, start, warm, feedback, total, seed)
        new = {name: new[i] for i, name in enumerate(names)}
        for name, p in model.named_parameters():
            p.grad = torch.from_numpy(new[name])
        opt.step()
        history.append({name: p.detach().numpy().copy() for name, p in model.named_parameters()})
    return history


# ------------------------------------------------------------ the distributed run


def make(compression, seed=0, dtype=torch.float32, **kwargs):
    model = mlp(seed).to(dtype)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM),
        named_parameters=model.named_parameters(), compression=compression, **kwargs)
    return model, opt


def train(model, opt, steps, what, passes=1, first=0, after_step=None):
    dtype = next(model.parameters()).dtype
    for step in range(first, steps):
        opt.zero_grad()
        for micro in range(passes):
            x, y = batch(step, micro)
            F.cross_entropy(model(part(x, r).to(dtype)), part(y, r)).float().backward()
        opt.step()
        same_on_all_ranks(model, f"{what}.{step}")
        if after_step is not None:
            after_step(step)


def check_against_simulation(what, cfg, sim, passes=1, **kwargs):
    # float64 on the ranks as in the simulation: what remains is the order of the sums
    model, opt = make(hvd.Compression.powersgd(**cfg), backward_passes_per_step=passes,
                      dtype=torch.float64, **kwargs)
    history = simulate(cfg["rank"], cfg["start_step"], STEPS, cfg.get("warm_start", True),
                       cfg.get("error_feedback", True), passes, **sim)
    worst = 0.0

    def compare(step):
        nonlocal worst
        for name, p in model.named_parameters():
            want = history[step][name]
            err = np.abs(p.detach().numpy() - want).max() / max(np.abs(want).max(), 1e-12)
            worst = max(worst, err)
            if err > 1e-9:
                fail(f"{what}: {name} after step {step} differs from the simulation by "
                     f"{err:.2e} (relative to its largest element)")

    train(model, opt, STEPS, what, passes, after_step=compare)
    print(f"rank {r}: {what}: max relative difference from the simulation {worst:.2e}", flush=True)
    return model, opt


default = dict(rank=2, start_step=4)
check_against_simulation("default", default, {})
check_against_simulation("cold, no feedback, rank 1",
                         dict(rank=1, start_step=3, warm_start=False, error_feedback=False), {})
check_against_simulation("2 passes per step", default, {}, passes=2)
check_against_simulation("op=Sum", default, {"total": True}, op=hvd.Sum)

# No per-step allocation of gradient-sized tensors: the error buffers are
# written in place once compression runs.
model, opt = make(hvd.Compression.powersgd(rank=2, start_step=1))
train(model, opt, 2, "in place")
buffers = {n: t.data_ptr() for n, t in opt._powersgd.errors.items()}
train(model, opt, 4, "in place", first=2)
moved = sorted(n for n, t in opt._powersgd.errors.items() if t.data_ptr() != buffers[n])
if moved:
    fail(f"PowerSGD allocated new error buffers after its first compressed step: {moved}")

# The simulation is not plain averaging after start_step: the compression is visible.
plain = simulate(2, STEPS, STEPS)[-1]
compressed = simulate(2, 4, STEPS)[-1]
if np.abs(plain["0.weight"] - compressed["0.weight"]).max() < 1e-4:
    fail("PowerSGD's simulation equals plain averaging: the check would not see compression")

# ------------------------------------------------------------ process sets (3 ranks)


def check_process_set(members):
    """PowerSGD over a process set: its members match the simulation on
    their data and stay bitwise identical; the rank outside trains alone."""
    ps = hvd.add_process_set(members)
    member = r in members
    model, opt = make(hvd.Compression.powersgd(**default), dtype=torch.float64, process_set=ps)
    history = simulate(2, 4, STEPS, members=members) if member \
        else simulate(2, STEPS, STEPS, members=[r])  # (alone: plain local steps)
    worst = 0.0
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step)
        F.cross_entropy(model(part(x, r).double()), part(y, r)).backward()
        opt.step()
        for name, p in model.named_parameters():
            want = history[step][name]
            worst = max(worst, np.abs(p.detach().numpy() - want).max() / np.abs(want).max())
        if member:
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            every = hvd.allgather(flat.unsqueeze(0), name=f"same.set.{step}", process_set=ps)
            if not all(torch.equal(row, flat) for row in every):
                fail(f"process set {members}: members differ bitwise after step {step}")
    print(f"rank {r}: process set {members}: max relative difference from its simulation "
          f"{worst:.2e}", flush=True)
    if worst > 1e-9:
        fail(f"process set {members}: rank {r} differs from the simulation by {worst:.2e}")
    hvd.remove_process_set(ps)


if n == 3:
    check_process_set([0, 2])
    check_process_set([1, 2])

# ------------------------------------------------------------ checkpoint (float32)

whole_model, whole_opt = make(hvd.Compression.powersgd(**default))
train(whole_model, whole_opt, STEPS, "uninterrupted")
model, opt = make(hvd.Compression.powersgd(**default))
train(model, opt, 7, "before checkpoint")
state = opt.state_dict()["powersgd"]
if state["step"] != 7 or sorted(state["errors"]) != ["0.weight", "2.weight"] \
        or sorted(state["qs"]) != ["0.weight", "2.weight"]:
    fail(f"state_dict's powersgd entry: step {state['step']}, errors {sorted(state['errors'])}, "
         f"qs {sorted(state['qs'])}")
buf = io.BytesIO()
torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
del model, opt
buf.seek(0)
saved = torch.load(buf)
model, opt = make(hvd.Compression.powersgd(**default), seed=123)
model.load_state_dict(saved["model"])
opt.load_state_dict(saved["opt"])
train(model, opt, STEPS, "after checkpoint", first=7)
for (name, p), q in zip(model.named_parameters(), whole_model.parameters()):
    if not torch.equal(p, q):
        fail(f"checkpoint: {name} after the restart differs from the uninterrupted run by "
             f"{float((p - q).abs().max()):.2e}")
# elastic: a commit at step 7, then what a restart does (restore the commit,
# then sync() from rank 0, as elastic.run): the error buffers are each rank's
# own, so the run continues exactly as the uninterrupted one
model, opt = make(hvd.Compression.powersgd(**default))
state = hvd.elastic.TorchState(model=model, optimizer=opt)
train(model, opt, 7, "elastic, before the commit")
state.commit()
train(model, opt, 10, "elastic, lost steps", first=7)
state.restore()
state.sync()
train(model, opt, STEPS, "elastic, after the restart", first=7)
for (name, p), q in zip(model.named_parameters(), whole_model.parameters()):
    if not torch.equal(p, q):
        fail(f"elastic: {name} after the restore and sync differs from the uninterrupted run by "
             f"{float((p - q).abs().max()):.2e}")

model, opt = make(hvd.Compression.powersgd(rank=1, start_step=4))
expect_raises(ValueError, lambda: opt.load_state_dict(saved["opt"]), "other configuration",
              match="cannot be loaded")

# bfloat16 parameters: the products run in float32, replicas stay identical
model, opt = make(hvd.Compression.powersgd(rank=2, start_step=1), dtype=torch.bfloat16)
train(model, opt, 4, "bfloat16")
if not all(torch.isfinite(p).all() for p in model.parameters()):
    fail("bfloat16 training with PowerSGD produced non-finite parameters")

# ------------------------------------------------------------ refused combinations

psgd = hvd.Compression.powersgd()
expect_raises(ValueError, lambda: make(psgd, staleness=1), "staleness", match="staleness")
expect_raises(ValueError, lambda: make(psgd, zero_stage=1), "ZeRO", match="zero_stage")
expect_raises(ValueError, lambda: make(psgd, groups=2), "groups", match="groups")
expect_raises(TypeError, lambda: hvd.allreduce(torch.ones(4, 4), name="single", compression=psgd),
              "single collective", match="DistributedOptimizer")
expect_raises(CollectiveMismatchError,
              lambda: make(hvd.Compression.powersgd(rank=1 if r == 0 else 2)),
              "rank differs across ranks", match="PowerSGD(rank=")
make(hvd.Compression.powersgd)  # the class itself: the defaults


def sparse_model():
    torch.manual_seed(0)
    return nn.Embedding(50, 8, sparse=True)


for dense in (False, True):
    emb = sparse_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                   named_parameters=emb.named_parameters(),
                                   compression=hvd.Compression.powersgd(start_step=0),
                                   sparse_as_dense=dense)
    emb(torch.tensor([r, 3 + r])).sum().backward()
    if dense:
        opt.step()
        same_on_all_ranks(emb, "sparse as dense")
    else:
        expect_raises(ValueError, opt.step, "sparse gradient", match="sparse_as_dense=True")

done()

"""commlib.torch.DistributedOptimizer and the model helpers, on every rank:
equivalence with single-process training on the combined batch, gradient
accumulation, clipping, unused parameters, error cases, groups, sparse
gradients, compression, parameter/optimizer-state broadcast."""
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import done, expect_raises, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
B = 8  # per-rank batch
STEPS = 20


def mlp(seed=0, width=32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, width), nn.Tanh(), nn.Linear(width, 16), nn.Tanh(),
                         nn.Linear(16, 4))


def batch(step, rows=None):
    """The combined batch of all ranks at ``step`` (the same on every rank)."""
    g = torch.Generator().manual_seed(1000 + step)
    rows = rows or n * B
    return torch.randn(rows, 10, generator=g), torch.randint(0, 4, (rows,), generator=g)


def mine(t, per=B):
    return t[r * per:(r + 1) * per]


def rel_err(model, ref):
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        worst = max(worst, float((p - q).detach().abs().max() / q.detach().abs().max().clamp_min(1e-12)))
    return worst


def same_on_all_ranks(model, what):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.unsqueeze(0), name=f"same.{what}")
    for k in range(n):
        if not torch.equal(every[k], flat):
            fail(f"{what}: parameters differ bitwise between rank {r} and rank {k}")


def train_pair(make_opt, steps=STEPS, dist_kwargs=None, clip=None, loss_scale=1.0, seed=0):
    """Trains a model with DistributedOptimizer on this rank's slice and a
    reference copy on the combined batch; returns (model, reference)."""
    model, ref = mlp(seed), mlp(seed)
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   **(dist_kwargs or {}))
    ref_opt = make_opt(ref.parameters())
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(mine(x)), mine(y)).backward()
        if clip is None:
            opt.step()
        else:
            opt.synchronize()
            nn.utils.clip_grad_norm_(model.parameters(), clip)
            with opt.skip_synchronize():
                opt.step()
        ref_opt.zero_grad()
        (F.cross_entropy(ref(x), y) * loss_scale).backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(ref.parameters(), clip)
        ref_opt.step()
    return model, ref, opt


def check_equivalent(model, ref, what, tol=1e-5):
    err = rel_err(model, ref)
    if err > tol:
        fail(f"{what}: relative error {err:.3g} > {tol}")
    same_on_all_ranks(model, what)
    return err


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


# ------------------------------------------------------------ the equivalence target
model, ref, opt = train_pair(sgd)
err_sgd = check_equivalent(model, ref, "SGD equivalence")
if not isinstance(opt, torch.optim.SGD) or "state" not in opt.state_dict():
    fail("DistributedOptimizer is not an SGD with a state_dict")
model, ref, opt = train_pair(lambda ps: torch.optim.Adam(ps, lr=1e-3))
err_adam = check_equivalent(model, ref, "Adam equivalence")
if r == 0:
    print(f"equivalence after {STEPS} steps, {n} ranks x batch {B} vs 1 process x {n * B}: "
          f"max relative error SGD {err_sgd:.3g}, Adam {err_adam:.3g}", flush=True)

# gradient clipping through synchronize() + skip_synchronize(): no warning
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model, ref, _ = train_pair(sgd, steps=5, clip=0.05)
if any("skip_synchronize" in str(w.message) for w in caught):
    fail("skip_synchronize still warned")
check_equivalent(model, ref, "clipping")
# step() after synchronize() without skip_synchronize() warns (as in Horovod)
x, y = batch(0)
model2 = mlp()
opt2 = hvd.DistributedOptimizer(sgd(model2.parameters()), named_parameters=model2.named_parameters())
F.cross_entropy(model2(mine(x)), mine(y)).backward()
opt2.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt2.step()
if not any("skip_synchronize" in str(w.message) for w in caught):
    fail("step() after synchronize() did not warn")

# op=Sum, gradient_predivide_factor, groups, compression
model, ref, _ = train_pair(sgd, steps=5, dist_kwargs={"op": hvd.Sum}, loss_scale=n)
check_equivalent(model, ref, "op=Sum")
model, ref, _ = train_pair(sgd, steps=5, dist_kwargs={"gradient_predivide_factor": 2.0})
check_equivalent(model, ref, "gradient_predivide_factor")
model, ref, _ = train_pair(sgd, steps=5, dist_kwargs={"groups": 2})
check_equivalent(model, ref, "groups=2")
m0 = mlp()
model, ref, _ = train_pair(sgd, steps=5, dist_kwargs={"num_groups": 1})
check_equivalent(model, ref, "num_groups=1")
model, ref, _ = train_pair(sgd, steps=5, dist_kwargs={"compression": hvd.Compression.fp16})
check_equivalent(model, ref, "fp16 compression", tol=5e-3)
model, ref, _ = train_pair(sgd, steps=5, dist_kwargs={"compression": hvd.Compression.bf16})
check_equivalent(model, ref, "bf16 compression", tol=5e-2)
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    sgd(m0.parameters()), op=hvd.Sum, gradient_predivide_factor=2.0), "predivide with Sum")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    sgd(m0.parameters()), op=hvd.Adasum, gradient_predivide_factor=2.0), "predivide with Adasum")

# groups given as lists of parameters, including a group left incomplete by an unused layer
model, ref = mlp(), mlp()
ps = list(model.parameters())
opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                               groups=[ps[:2], ps[2:]])
ref_opt = sgd(ref.parameters())
for step in range(4):
    x, y = batch(step)
    opt.zero_grad()
    F.cross_entropy(model(mine(x)), mine(y)).backward()
    opt.step()
    ref_opt.zero_grad()
    F.cross_entropy(ref(x), y).backward()
    ref_opt.step()
check_equivalent(model, ref, "groups as lists")

# frozen layers unfrozen later, and a param group added during training
model, ref = mlp(), mlp()
for m in (model, ref):
    m[0].requires_grad_(False)
head = lambda m: list(m[4].parameters())  # noqa: E731
body = lambda m: [p for i in (0, 2) for p in m[i].parameters()]  # noqa: E731
opt = hvd.DistributedOptimizer(sgd(body(model)), named_parameters=[
    (k, v) for k, v in model.named_parameters() if not k.startswith("4.")])
ref_opt = sgd(body(ref))
for step in range(6):
    if step == 2:
        for m in (model, ref):
            m[0].requires_grad_(True)
    if step == 4:
        opt.add_param_group({"params": head(model), "lr": 0.05})
        ref_opt.add_param_group({"params": head(ref), "lr": 0.05})
    x, y = batch(step)
    opt.zero_grad()
    F.cross_entropy(model(mine(x)), mine(y)).backward()
    opt.step()
    ref_opt.zero_grad()
    F.cross_entropy(ref(x), y).backward()
    ref_opt.step()
check_equivalent(model, ref, "unfrozen layer and added param group")

# ------------------------------------------------------------ backward_passes_per_step
model, ref = mlp(), mlp()
opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                               backward_passes_per_step=2)
ref_opt = sgd(ref.parameters())
for step in range(6):
    opt.zero_grad()
    ref_opt.zero_grad()
    for micro in range(2):
        x, y = batch(100 * step + micro)
        F.cross_entropy(model(mine(x)), mine(y)).backward()
        if micro == 0 and opt._handles:
            fail("backward_passes_per_step=2 started allreduces after the first pass")
        F.cross_entropy(ref(x), y).backward()
    opt.step()
    ref_opt.step()
check_equivalent(model, ref, "backward_passes_per_step=2")
# a third pass before step() raises, as in Horovod
x, y = batch(0)
opt.zero_grad()
for micro in range(2):
    F.cross_entropy(model(mine(x)), mine(y)).backward()
expect_raises(AssertionError, lambda: F.cross_entropy(model(mine(x)), mine(y)).backward(),
              "too many backward passes", "backward_passes_per_step")
opt.step()

# ------------------------------------------------------------ unused parameters: no deadlock
class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.trunk = nn.Linear(10, 8)
        self.a, self.b, self.c = nn.Linear(8, 4), nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x, head):
        return getattr(self, head)(torch.tanh(self.trunk(x)))


def head_of(k):
    return "a" if k % 2 == 0 else "b"


model, ref = Heads(), Heads()
c_before = model.c.weight.detach().clone()
make = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1)  # noqa: E731
opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters())
ref_opt = make(ref.parameters())
for step in range(5):
    x, y = batch(step)
    opt.zero_grad()
    F.cross_entropy(model(mine(x), head_of(r)), mine(y)).backward()
    opt.step()
    ref_opt.zero_grad()
    sum(F.cross_entropy(ref(x[k * B:(k + 1) * B], head_of(k)), y[k * B:(k + 1) * B])
        for k in range(n)).div(n).backward()
    ref_opt.step()
check_equivalent(model, ref, "unused parameters")
if model.c.weight.grad is not None or not torch.equal(model.c.weight, c_before):
    fail("a parameter unused on every rank got a gradient or was updated")
if n > 1 and model.b.weight.grad is None:
    fail("head b (used on rank 1) has no gradient on this rank")

# ------------------------------------------------------------ zero_grad with allreduces in flight
model = mlp()
opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
x, y = batch(0)
F.cross_entropy(model(mine(x)), mine(y)).backward()
expect_raises(AssertionError, opt.zero_grad, "zero_grad with pending allreduces", "zero_grad")
opt.step()
opt.zero_grad()

# ------------------------------------------------------------ sparse gradients
class Emb(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.emb = nn.Embedding(20, 4, sparse=True)
        self.out = nn.Linear(4, 1)

    def forward(self, idx):
        return self.out(self.emb(idx).mean(1)).squeeze(1)


def train_embeddings(model, ref, opt, ref_opt, seed):
    """4 steps: the distributed model on this rank's rows, the reference on all."""
    for step in range(4):
        g = torch.Generator().manual_seed(seed + step)
        idx = torch.randint(0, 20, (n * B, 3), generator=g)
        target = torch.randn(n * B, generator=g)
        opt.zero_grad()
        F.mse_loss(model(mine(idx)), mine(target)).backward()
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(idx), target).backward()
        ref_opt.step()


for sparse_as_dense in (False, True):
    model, ref = Emb(), Emb()
    make = lambda ps: torch.optim.SGD(ps, lr=0.5)  # noqa: E731
    opt = hvd.DistributedOptimizer(make(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    train_embeddings(model, ref, opt, make(ref.parameters()), seed=0)
    check_equivalent(model, ref, f"sparse gradients (sparse_as_dense={sparse_as_dense})")

# SparseAdam takes sparse gradients only: with sparse_as_dense=False they stay sparse
class EmbOnly(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.emb = nn.Embedding(20, 4, sparse=True)

    def forward(self, idx):
        return self.emb(idx).mean((1, 2))


model, ref = EmbOnly(), EmbOnly()
opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters())
train_embeddings(model, ref, opt, torch.optim.SparseAdam(ref.parameters(), lr=0.05), seed=100)
check_equivalent(model, ref, "SparseAdam on sparse gradients")

# ------------------------------------------------------------ parameter lists that differ across ranks
odd = r == n - 1


def mismatch(build, what, fragment):
    err = expect_raises(hvd.CollectiveMismatchError, build, what)
    if fragment not in str(err):
        fail(f"{what}: message lacks {fragment!r}: {err}")


m_shape = nn.Sequential(nn.Linear(4, 5 if odd else 4))
mismatch(lambda: hvd.DistributedOptimizer(sgd(m_shape.parameters()),
                                          named_parameters=m_shape.named_parameters()),
         "shape differs", "'0.weight'")
m_names = nn.Sequential(nn.Linear(4, 4))
named = [(("x." if odd else "") + k, v) for k, v in m_names.named_parameters()]
mismatch(lambda: hvd.DistributedOptimizer(sgd(m_names.parameters()), named_parameters=named),
         "names differ", "missing")
m_extra = nn.Sequential(*[nn.Linear(4, 4) for _ in range(3 if odd else 2)])
mismatch(lambda: hvd.DistributedOptimizer(sgd(m_extra.parameters()),
                                          named_parameters=m_extra.named_parameters()),
         "extra parameter", "'2.weight'")
m_dtype = nn.Sequential(nn.Linear(4, 4, dtype=torch.float64 if odd else torch.float32))
mismatch(lambda: hvd.DistributedOptimizer(sgd(m_dtype.parameters()),
                                          named_parameters=m_dtype.named_parameters()),
         "dtype differs", "float64")
mismatch(lambda: hvd.DistributedOptimizer(sgd(m0.parameters()),
                                          backward_passes_per_step=2 if odd else 1),
         "options differ", "options")
# the job is still usable afterwards
if float(hvd.allreduce(torch.ones(1), op=hvd.Sum)) != n:
    fail("allreduce after mismatches")

# unsupported dtypes and devices: every rank raises locally, before any collective
cplx = nn.Linear(2, 2, dtype=torch.complex64)
expect_raises(TypeError, lambda: hvd.DistributedOptimizer(sgd(cplx.parameters())),
              "complex parameters", "unsupported dtype")
meta = nn.Linear(2, 2, device="meta")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(sgd(meta.parameters())),
              "meta parameters", "CPU and CUDA tensors only")
expect_raises(TypeError, lambda: hvd.DistributedOptimizer(object()), "not an optimizer")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    sgd(m0.parameters()), named_parameters=[("a", p) for p in m0.parameters()]),
    "duplicate names", "duplicates")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    sgd(m0.parameters()), named_parameters=list(m0.named_parameters())[:1]),
    "unnamed parameters", "not named")

# ------------------------------------------------------------ broadcast_parameters / optimizer state
root = n - 1
want = mlp(seed=root).state_dict()
for form in ("state_dict", "named_parameters", "parameters"):
    model = mlp(seed=r)
    if form == "state_dict":
        hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    elif form == "named_parameters":
        hvd.broadcast_parameters(list(model.named_parameters()), root_rank=root)
    else:
        hvd.broadcast_parameters(model.parameters(), root_rank=root)
    for k, v in model.state_dict().items():
        if not torch.equal(v, want[k]):
            fail(f"broadcast_parameters ({form}): {k} differs from root's")
bn = nn.BatchNorm1d(3)
bn.num_batches_tracked.fill_(r + 7)
hvd.broadcast_parameters(bn.state_dict(), root_rank=0)
if int(bn.num_batches_tracked) != 7:
    fail("broadcast_parameters of a 0-d buffer")

model = mlp(seed=r)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
if r == root:
    for step in range(3):
        x, y = batch(step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    opt.param_groups[0]["lr"] = 0.05
    opt.param_groups[0]["betas"] = (0.8, 0.95)
dist = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
hvd.broadcast_optimizer_state(dist, root_rank=root)
root_sd = hvd.broadcast_object(opt.state_dict() if r == root else None, root_rank=root)
sd = dist.state_dict()
if sd["param_groups"] != root_sd["param_groups"]:
    fail(f"optimizer param_groups differ: {sd['param_groups']} vs {root_sd['param_groups']}")
if sorted(sd["state"]) != sorted(root_sd["state"]):
    fail("optimizer state keys differ")
for pid, st in root_sd["state"].items():
    for k, v in st.items():
        if not torch.equal(torch.as_tensor(sd["state"][pid][k]), torch.as_tensor(v)):
            fail(f"optimizer state {pid}.{k} differs from root's")
if dist.param_groups[0]["betas"] != (0.8, 0.95) or dist.param_groups[0]["lr"] != 0.05:
    fail("optimizer options not broadcast")
# ... and training goes on in lockstep
hvd.broadcast_parameters(model.state_dict(), root_rank=root)
for step in range(3):
    x, y = batch(step)
    dist.zero_grad()
    F.cross_entropy(model(mine(x)), mine(y)).backward()
    dist.step()
same_on_all_ranks(model, "after broadcast_optimizer_state")
# LR schedulers work on the wrapper
sched = torch.optim.lr_scheduler.StepLR(dist, step_size=1, gamma=0.5)
dist.zero_grad()
F.cross_entropy(model(mine(x)), mine(y)).backward()
dist.step()
sched.step()
if abs(dist.param_groups[0]["lr"] - 0.025) > 1e-12:
    fail(f"StepLR: lr {dist.param_groups[0]['lr']}")
# a fresh optimizer everywhere: Horovod's zero-gradient step gives every parameter state
fresh = torch.optim.SGD(mlp().parameters(), lr=0.1, momentum=0.9)
hvd.broadcast_optimizer_state(fresh, root_rank=0)
if len(fresh.state_dict()["state"]) != len(list(mlp().parameters())):
    fail("fresh optimizer: state not initialised for every parameter")
done()

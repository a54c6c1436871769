"""broadcast_optimizer_state as Horovod's on every rank: an optimizer without
state (no gradient yet) gets it from a zero-gradient step first, so
Horovod's test_broadcast_state_no_grad runs (an int parameter that requires
no gradient keeps grad None, the others get a zero grad that can itself be
broadcast) and the parameters stay as they were; with SGD momentum and Adam
(plain and DistributedOptimizer), fresh or with state for some parameters
only (different ones on each rank), every rank ends with root's state and
hyperparameters, and training then keeps the replicas identical."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import done, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
root = n - 1


def check_state_like_root(opt, what):
    """opt's state_dict equals root's (every tensor bitwise, every option)."""
    sd = opt.state_dict()
    want = hvd.broadcast_object(sd if r == root else None, root_rank=root, name=f"want.{what}")
    if sd["param_groups"] != want["param_groups"]:
        fail(f"{what}: param_groups {sd['param_groups']} != root's {want['param_groups']}")
    if sorted(sd["state"]) != sorted(want["state"]):
        fail(f"{what}: state of parameters {sorted(sd['state'])}, root's {sorted(want['state'])}")
    for pid, st in want["state"].items():
        if sorted(st) != sorted(sd["state"][pid]):
            fail(f"{what}: state keys of {pid}: {sorted(sd['state'][pid])} != {sorted(st)}")
        for k, v in st.items():
            if not same_value(sd["state"][pid][k], v):
                fail(f"{what}: state {pid}.{k} differs from root's")
    return sd


def same_value(a, b) -> bool:
    """Bitwise equal tensors (numbers as tensors), lists and tuples of them
    item by item (LBFGS's history), anything else by ==."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(same_value(x, y) for x, y in zip(a, b)))
    if a is None or b is None:
        return a is b
    return torch.equal(torch.as_tensor(a), torch.as_tensor(b))


# ------------------------------------------------------------ Horovod's test_broadcast_state_no_grad
class ModelNoGrad(nn.Module):
    def __init__(self, a, b):
        super().__init__()
        self.a = nn.Parameter(a.int(), requires_grad=False)
        self.b = nn.Parameter(b)

    def forward(self, x):
        return torch.index_select(self.b, 0, self.a.long()) * x


torch.manual_seed(r)
model = ModelNoGrad(torch.tensor([1.0, 3.0]), torch.rand(4))
opt = torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-2, momentum=0.9, nesterov=True)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
before = model.b.detach().clone()
hvd.broadcast_optimizer_state(opt, root_rank=0)
grad = opt.param_groups[0]["params"][1].grad
if grad is None:
    fail("no_grad model: the parameter that requires a gradient has no zero grad")
if not torch.equal(hvd.broadcast(grad, root_rank=0), grad) or grad.abs().sum() != 0:
    fail("no_grad model: the grad is not a zero tensor equal on every rank")
if opt.param_groups[0]["params"][0].grad is not None:
    fail("no_grad model: the int parameter got a grad")
if not torch.equal(model.b, before):
    fail("the zero-gradient step moved the parameters (weight decay)")
check_state_like_root(opt, "no_grad model")


# ------------------------------------------------------------ SGD momentum and Adam
def net():
    torch.manual_seed(10 + r)  # different values on every rank: root's must win
    return nn.ModuleDict({"used": nn.Linear(5, 3), "unused": nn.Linear(5, 3),
                          "frozen": nn.Linear(3, 3).requires_grad_(False)})


def forward(m, x, branch="used"):
    return m["frozen"](torch.tanh(m[branch](x)))


MAKERS = {"SGD": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
          "Adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=1e-3)}
for kind, make in MAKERS.items():
    for wrapped in (False, True):
        for history in ("fresh", "partial"):
            what = f"{kind} {'DistributedOptimizer' if wrapped else 'plain'} {history}"
            m = net()
            opt = make(m.parameters())
            if r == root:
                opt.param_groups[0]["lr"] *= 3  # root's options win too
            if history == "partial":  # each rank has state for other parameters
                forward(m, torch.randn(4, 5), "used" if r % 2 == 0 else "unused").sum().backward()
                opt.step()
                opt.zero_grad()
            if wrapped:
                opt = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters())
            params = {k: v.detach().clone() for k, v in m.state_dict().items()}
            hvd.broadcast_optimizer_state(opt, root_rank=root)
            sd = check_state_like_root(opt, what)
            trainable = sum(p.requires_grad for p in m.parameters())
            if history == "fresh" and len(sd["state"]) != trainable:
                fail(f"{what}: state for {len(sd['state'])} parameters, want all {trainable} "
                     "that require a gradient (Horovod's zero-gradient step)")
            if any(not torch.equal(v, params[k]) for k, v in m.state_dict().items()):
                fail(f"{what}: broadcast_optimizer_state changed the parameters")
            if not wrapped:
                continue
            hvd.broadcast_parameters(m.state_dict(), root_rank=root)
            for step in range(2):
                opt.zero_grad()
                forward(m, torch.randn(4, 5)).sum().backward()
                opt.step()
            for k, v in m.state_dict().items():
                if not torch.equal(hvd.broadcast(v, root_rank=root, name=f"{what}.{k}"), v):
                    fail(f"{what}: replicas differ in {k} after training")
            check_state_like_root(opt, f"{what}, trained")

# SparseAdam (sparse gradients only: its zero-gradient step takes sparse zeros, and
# they stay behind for the next backward), fresh and wrapped.
emb = nn.Embedding(10, 3, sparse=True)
opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters()), named_parameters=emb.named_parameters())
hvd.broadcast_parameters(emb.state_dict(), root_rank=root)
hvd.broadcast_optimizer_state(opt, root_rank=root)
check_state_like_root(opt, "SparseAdam, fresh")
for step in range(2):
    opt.zero_grad()
    emb(torch.tensor([1, 2, r % 10])).sum().backward()
    opt.step()
if not torch.equal(hvd.broadcast(emb.weight.detach(), root_rank=root, name="sparseadam.w"), emb.weight.detach()):
    fail("SparseAdam: replicas differ after training")
# LBFGS (a step needs a closure: no zero-gradient step), fresh, then stepped apart on each rank.
lin = nn.Linear(3, 1)
opt = torch.optim.LBFGS(lin.parameters(), lr=0.1)
hvd.broadcast_optimizer_state(opt, root_rank=root)
if opt.state:
    fail("LBFGS, fresh: broadcast_optimizer_state made state")
x, y = torch.randn(8, 3) * (r + 1), torch.randn(8, 1)


def closure():
    opt.zero_grad()
    loss = F.mse_loss(lin(x), y)
    loss.backward()
    return loss


opt.step(closure)
hvd.broadcast_optimizer_state(opt, root_rank=root)
check_state_like_root(opt, "LBFGS, stepped apart")
done()

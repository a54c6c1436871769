"""A call refused by the numpy API's own checks on one rank (a bad root, an
``out=`` of the wrong shape, a 0-d allgather) fails on the other ranks at
once, naming the rank and its reason, instead of leaving them waiting; and
an unnamed refused call still uses up its generated name, so that every
later unnamed call pairs with the others' (before, rank BAD's later
broadcasts silently got the others' previous data). The same bad call on
every rank leaves nothing behind."""
import time

import numpy as np

import commlib
from _common import check_equal, done, expect_raises, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
BAD = 1  # the rank whose arguments are wrong


def refused_on_bad(call_bad, call_good, exc, match, what):
    """call_bad() on rank BAD raises exc (its own check); call_good() on
    the others raises CollectiveMismatchError naming BAD and match, at once."""
    if r == BAD:
        expect_raises(exc, call_bad, f"{what}: the rank with bad arguments", match=match)
        return
    start = time.monotonic()
    e = expect_raises(commlib.CollectiveMismatchError, call_good, f"{what}: a rank with good arguments",
                      match=f"rank {BAD} could not submit")
    if match not in str(e):
        fail(f"{what}: the error does not give rank {BAD}'s reason ({match!r}): {e}")
    if time.monotonic() - start > 5:
        fail(f"{what}: took {time.monotonic() - start:.1f} s (COMMLIB_TIMEOUT is 300 s: it should be at once)")


def unnamed_broadcasts(what):
    for k in range(3):
        x = np.full(4, 10.0 * k + 1) if r == 0 else np.full(4, -1.0)
        check_equal(commlib.broadcast(x, root_rank=0), np.full(4, 10.0 * k + 1), f"{what}: unnamed broadcast {k}")


# 1. An unnamed broadcast with a root outside the job on rank BAD (checked in
# Python before its name is generated), through the blocking form (which
# calls the _async one: one abort only, or the later calls would fail).
refused_on_bad(lambda: commlib.broadcast(np.zeros(4), root_rank=n + 5),
               lambda: commlib.broadcast(np.zeros(4), root_rank=0), ValueError, "outside the job",
               "unnamed broadcast, bad root")
unnamed_broadcasts("after a bad root")

# 2. A named allreduce into an out= of the wrong shape on rank BAD; the name
# works again afterwards, on every rank.
x = np.full(3, float(r + 1))
refused_on_bad(lambda: commlib.allreduce(x, name="ar.out", op=commlib.Sum, out=np.empty(4)),
               lambda: commlib.allreduce(x, name="ar.out", op=commlib.Sum), ValueError, "out has shape",
               "named allreduce, bad out=")
for _ in range(2):
    check_equal(commlib.allreduce(x, name="ar.out", op=commlib.Sum), np.full(3, float(n * (n + 1) // 2)),
                "allreduce 'ar.out' after the refusal")

# 3. A 0-d tensor to an unnamed allgather_async on rank BAD (ScalarTensorError).
refused_on_bad(lambda: commlib.allgather_async(np.float32(1.0)),
               lambda: commlib.allgather(np.ones(1, np.float32)), commlib.ScalarTensorError, "0-d",
               "unnamed allgather, 0-d")
got = commlib.allgather(np.full(1, float(r)))
check_equal(got, np.arange(n, dtype=np.float64), "unnamed allgather after the refusal")

# 4. An in-place broadcast_ into a read-only array, a name the response cache
# holds (called twice before).
y = np.zeros(2)
for _ in range(2):
    commlib.broadcast_(y, root_rank=0, name="bc.cached")
ro = np.zeros(2)
ro.flags.writeable = False
refused_on_bad(lambda: commlib.broadcast_(ro, root_rank=0, name="bc.cached"),
               lambda: commlib.broadcast_(y, root_rank=0, name="bc.cached"), ValueError, "read-only",
               "cached broadcast_, read-only")
y[:] = r + 7
check_equal(commlib.broadcast_(y, root_rank=0, name="bc.cached"), np.full(2, 7.0), "bc.cached afterwards")

# 5. The same bad call on every rank (an unnamed reducescatter with an
# unknown op): each rank raises its own ValueError, and nothing is left
# behind for the next calls.
for _ in range(2):
    expect_raises(ValueError, lambda: commlib.reducescatter(np.ones(n), op="bogus"), "reducescatter, bad op",
                  match="unsupported reduction op")
check_equal(commlib.reducescatter(np.ones(2 * n), op=commlib.Sum), np.full(2, float(n)),
            "unnamed reducescatter after bad calls on every rank")
unnamed_broadcasts("at the end")

# 5b. Arguments beyond what the core's C types hold, on rank BAD: an alltoall
# split of 2**63 (uint64: once an OverflowError in building the request,
# which was not told to the others: they waited for COMMLIB_TIMEOUT) and a
# prescale_factor beyond a double's range (the same).
x = np.zeros((n, 2))
big = np.array([2 ** 63] + [0] * (n - 1), np.uint64)
refused_on_bad(lambda: commlib.alltoall(x, splits=big), lambda: commlib.alltoall(x, splits=[1] * n),
               ValueError, "beyond the range", "unnamed alltoall, a split of 2**63")
refused_on_bad(lambda: commlib.allreduce(np.ones(2), prescale_factor=10 ** 400),
               lambda: commlib.allreduce(np.ones(2)), ValueError, "out of a float's range",
               "unnamed allreduce, prescale_factor 10**400")
check_equal(commlib.alltoall(np.full((n, 1), float(r))), np.arange(n, dtype=np.float64).reshape(n, 1),
            "unnamed alltoall afterwards")
unnamed_broadcasts("after the out-of-range arguments")

# 6. The same through commlib.torch: a 0-d unnamed allgather, a bad root to an
# unnamed broadcast_, an unsupported dtype to a named allreduce_async_.
import torch  # noqa: E402

import commlib.torch as ct  # noqa: E402

refused_on_bad(lambda: ct.allgather(torch.tensor(1.0)), lambda: ct.allgather(torch.ones(1)),
               commlib.ScalarTensorError, "0-d", "torch: unnamed allgather, 0-d")
check_equal(ct.allgather(torch.full((1,), float(r))).numpy(), np.arange(n, dtype=np.float32),
            "torch: unnamed allgather afterwards")
t = torch.zeros(3)
refused_on_bad(lambda: ct.broadcast_(t, n + 2), lambda: ct.broadcast_(t, 0), ValueError, "root_rank",
               "torch: unnamed broadcast_, bad root")
for k in range(2):
    t.fill_(float(k + 5) if r == 0 else -1.0)
    check_equal(ct.broadcast_(t, 0).numpy(), np.full(3, float(k + 5), np.float32),
                f"torch: unnamed broadcast_ {k} afterwards")
g = torch.ones(4, dtype=torch.complex64) if r == BAD else torch.ones(4)
refused_on_bad(lambda: ct.synchronize(ct.allreduce_async_(g, name="t.grad", op=ct.Sum)),
               lambda: ct.synchronize(ct.allreduce_async_(g, name="t.grad", op=ct.Sum)), TypeError, "complex",
               "torch: named allreduce_async_, complex")
g = torch.ones(4)
check_equal(ct.synchronize(ct.allreduce_async_(g, name="t.grad", op=ct.Sum)).numpy(),
            np.full(4, float(n), np.float32), "torch: 't.grad' afterwards")

# 7. A CUDA call refused by its route's device checks on rank BAD (no GPU
# here: rank BAD's CPU tensors are taken for device tensors, which the
# route's check_device_tensors then refuses as "on several devices"). The
# others make the requests a CUDA call makes first: an allreduce of the
# call's name (a broadcast's), and through NCCL for an allgather the host allgather of every
# rank's rows ("<name>.rows"). Unnamed, so the names must stay in step too.
from commlib import gpu  # noqa: E402
from commlib.runtime import auto_name  # noqa: E402
from commlib.torch.cuda import cuda_dispatch  # noqa: E402


class AsDevice:
    """Within it, rank BAD's tensors take the CUDA route (through NCCL with
    nccl=True)."""
    def __init__(self, nccl=False):
        self.saved = (cuda_dispatch._is_device_tensor, gpu.cuda_path)
        self.nccl = nccl

    def __enter__(self):
        if r == BAD:
            cuda_dispatch._is_device_tensor = lambda x: True
            gpu.cuda_path = (lambda: "nccl") if self.nccl else self.saved[1]

    def __exit__(self, *exc):
        cuda_dispatch._is_device_tensor, gpu.cuda_path = self.saved


for nccl in (False, True):
    with AsDevice(nccl):
        refused_on_bad(lambda: ct.allreduce_async_(torch.ones(2)),
                       lambda: ct.allreduce_(torch.ones(2)), ValueError, "several devices",
                       f"torch: unnamed CUDA allreduce_async_ (nccl={nccl}), a CPU tensor")
    check_equal(ct.allreduce_(torch.ones(2), op=ct.Sum).numpy(), np.full(2, float(n), np.float32),
                f"torch: unnamed allreduce_ after the CUDA refusal (nccl={nccl})")
with AsDevice(nccl=True):
    refused_on_bad(lambda: ct.broadcast_async_(torch.ones(2), 0), lambda: ct.broadcast_(torch.ones(2), 0),
                   ValueError, "several devices", "torch: unnamed CUDA broadcast_async_ through NCCL, a CPU tensor")
check_equal(ct.broadcast_(torch.full((2,), float(r + 3)), 0).numpy(), np.full(2, 3.0, np.float32),
            "torch: unnamed broadcast_ after the CUDA refusal")
with AsDevice(nccl=True):
    refused_on_bad(lambda: ct.allgather_async(torch.ones(1)),  # (as cuda_nccl.allgather names it)
                   lambda: commlib.allgather(np.ones((1, 1), np.int64), name=auto_name("allgather") + ".rows"),
                   ValueError, "several devices", "torch: unnamed CUDA allgather through NCCL, a CPU tensor")
check_equal(ct.allgather(torch.full((1,), float(r))).numpy(), np.arange(n, dtype=np.float32),
            "torch: unnamed allgather after the CUDA refusal")

# Grouped CUDA calls refused by the route on rank BAD: the others' requests
# are those of their path: through NCCL one allreduce "<base>.<i>" per
# tensor (base: "grouped_allreduce.noname.<k>" unnamed), staged one grouped
# request of the call's name (an allreduce's); a grouped allgather or
# reducescatter is always staged (one request "<base>.<i>" per tensor).
def members_fail(start, count):
    """Starts ``count`` member requests (``start(i)``); each fails with
    CollectiveMismatchError (none left waiting); raises the first."""
    handles = [start(i) for i in range(count)]
    errors = []
    for i, h in enumerate(handles):
        try:
            ct.synchronize(h)
        except commlib.CollectiveMismatchError as e:
            errors.append(e)
        else:
            fail(f"member {i} of the grouped call ran on a rank with good arguments")
    raise errors[0]


group = [torch.ones(2), torch.ones(3)]
for nm in (None, "cgar"):
    with AsDevice(nccl=False):
        refused_on_bad(lambda: ct.grouped_allreduce_async(group, name=nm), lambda: ct.grouped_allreduce(group, name=nm),
                       ValueError, "several devices", f"torch: CUDA grouped_allreduce {nm} staged, CPU tensors")
    with AsDevice(nccl=True):
        base = nm if nm is not None or r == BAD else auto_name("grouped_allreduce")
        refused_on_bad(lambda: ct.grouped_allreduce_async_(group, name=nm),
                       lambda: members_fail(lambda i: ct.allreduce_async_(torch.ones(2 + i), name=f"{base}.{i}"), 2),
                       ValueError, "several devices", f"torch: CUDA grouped_allreduce_ {nm} through NCCL, CPU tensors")
    with AsDevice():
        refused_on_bad(lambda: ct.grouped_allgather_async(group, name=nm), lambda: ct.grouped_allgather(group, name=nm),
                       ValueError, "several devices", f"torch: CUDA grouped_allgather {nm}, CPU tensors")
        refused_on_bad(lambda: ct.grouped_reducescatter_async([torch.ones(n), torch.ones(2 * n)], name=nm),
                       lambda: ct.grouped_reducescatter([torch.ones(n), torch.ones(2 * n)], name=nm),
                       ValueError, "several devices", f"torch: CUDA grouped_reducescatter {nm}, CPU tensors")
    got = ct.grouped_allreduce([torch.full((2,), float(r)), torch.ones(3)], name=nm, op=ct.Sum)
    check_equal(got[0].numpy(), np.full(2, n * (n - 1) / 2, np.float32), f"torch: grouped_allreduce {nm} after")
    got = ct.grouped_allgather([torch.full((1,), float(r)), torch.ones(2)], name=nm)
    check_equal(got[0].numpy(), np.arange(n, dtype=np.float32), f"torch: grouped_allgather {nm} after")
    got = ct.grouped_reducescatter([torch.ones(n), torch.ones(2 * n)], name=nm, op=ct.Sum)
    check_equal(got[1].numpy(), np.full(2, float(n), np.float32), f"torch: grouped_reducescatter {nm} after")
for k in range(2):  # (the NCCL path's unnamed members, and their counter, in step)
    base = auto_name("grouped_allreduce")
    got = [ct.allreduce(torch.full((2,), float(r + k)), name=f"{base}.{i}", op=ct.Sum) for i in range(2)]
    check_equal(got[1].numpy(), np.full(2, n * (n - 1) / 2 + n * k, np.float32), f"unnamed NCCL-named group {k}")

# 8. commlib.torch's grouped allgather / reducescatter (one request per
# tensor) refused on rank BAD, whole (a 0-d tensor in the list) or at its
# first tensor (a bad op): the others fail at once, and none of their
# requests is left waiting: the same names work right after, and unnamed
# groups stay paired.
pair = [torch.ones(1), torch.tensor(2.0) if r == BAD else torch.ones(1)]
refused_on_bad(lambda: ct.grouped_allgather(pair), lambda: ct.grouped_allgather(pair), ValueError, "0-d",
               "torch: unnamed grouped_allgather, a 0-d tensor")
refused_on_bad(lambda: ct.grouped_allgather(pair, name="gag"), lambda: ct.grouped_allgather(pair, name="gag"),
               ValueError, "0-d", "torch: named grouped_allgather, a 0-d tensor")
rows = [torch.full((1, 2), float(r)), torch.full((2,), float(r))]
for nm in (None, "gag"):
    got = ct.grouped_allgather(rows, name=nm)
    check_equal(got[1].numpy(), np.repeat(np.arange(n, dtype=np.float32), 2), f"torch: grouped_allgather {nm} after")
rs = [torch.ones(n, 2), torch.ones(2 * n)]
bad_op = "bogus" if r == BAD else ct.Sum
refused_on_bad(lambda: ct.grouped_reducescatter(rs, name="grs", op=bad_op),
               lambda: ct.grouped_reducescatter(rs, name="grs", op=bad_op), ValueError, "op",
               "torch: named grouped_reducescatter, a bad op")
for nm in ("grs", None):
    got = ct.grouped_reducescatter(rs, name=nm, op=ct.Sum)
    check_equal(got[1].numpy(), np.full(2, float(n), np.float32), f"torch: grouped_reducescatter {nm} after")
# 9. The object and state helpers with a root outside the job on rank BAD:
# broadcast_object (the numpy API's, unnamed, and commlib.torch's, named),
# broadcast_parameters (a state_dict: named tensors; a list: unnamed ones;
# each tensor's broadcast is refused and told, the rest still go) and
# broadcast_optimizer_state (its skeleton's broadcast_object). Afterwards the
# same names work and unnamed calls stay paired.
from commlib.objects import broadcast_object  # noqa: E402

bad_root = n + 5 if r == BAD else 0
refused_on_bad(lambda: broadcast_object("x", root_rank=bad_root), lambda: broadcast_object("x", root_rank=0),
               ValueError, "outside the job", "unnamed broadcast_object, bad root")
refused_on_bad(lambda: ct.broadcast_object("x", bad_root, name="bo"), lambda: ct.broadcast_object("x", 0, name="bo"),
               ValueError, "outside the job", "torch: named broadcast_object, bad root")
for nm in (None, "bo"):
    if ct.broadcast_object({"from": r}, 0, name=nm) != {"from": 0}:
        fail(f"broadcast_object {nm} after the refusals: not root's object")
model = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for what, params in (("a state_dict", model.state_dict()), ("a list", list(model.parameters()))):
    refused_on_bad(lambda: ct.broadcast_parameters(params, root_rank=bad_root),
                   lambda: ct.broadcast_parameters(params, root_rank=0), ValueError, "outside the job",
                   f"torch: broadcast_parameters of {what}, bad root")
refused_on_bad(lambda: ct.broadcast_optimizer_state(opt, root_rank=bad_root),
               lambda: ct.broadcast_optimizer_state(opt, root_rank=0), ValueError, "outside the job",
               "torch: broadcast_optimizer_state, bad root")
with torch.no_grad():
    for p in model.parameters():
        p.fill_(float(r))
ct.broadcast_parameters(model.state_dict(), root_rank=0)
ct.broadcast_parameters(list(model.parameters()), root_rank=0)
for p in model.parameters():
    check_equal(p.detach().numpy(), np.zeros(p.shape, np.float32), "torch: broadcast_parameters after")
opt.param_groups[0]["lr"] = 0.1 * (r + 1)
ct.broadcast_optimizer_state(opt, root_rank=0)
if opt.param_groups[0]["lr"] != 0.1:
    fail(f"broadcast_optimizer_state after the refusal: lr {opt.param_groups[0]['lr']}")
unnamed_broadcasts("after the state helpers")
done()

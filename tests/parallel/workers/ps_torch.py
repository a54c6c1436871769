"""commlib.torch with process sets, every rank checking against torch/numpy:
collectives (in-place, async, grouped, sparse) and their gradients on the
set each rank belongs to (even ranks: a static set from init(process_sets=);
odd ranks: a set added afterwards; both run at once), objects,
broadcast_parameters/broadcast_optimizer_state on a set, refusals for
non-members and roots outside the set, and DistributedOptimizer(process_set=)
built on every rank: members end where training on the members' combined
batch ends, other ranks train locally (while running collectives on their own
set), and a global DistributedOptimizer afterwards still averages over all."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import done, expect_raises, fail, init_even_odd

torch.set_num_threads(1)
even, odd, mine, other = init_even_odd(hvd)
r, n = hvd.rank(), hvd.size()
f64 = torch.float64


def close(got, want, what, tol=1e-12):
    got, want = torch.as_tensor(got).detach().to(f64), torch.as_tensor(want).detach().to(f64)
    if got.shape != want.shape:
        fail(f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    if not torch.allclose(got, want, rtol=tol, atol=tol):
        fail(f"{what}: got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()}")


def data(k, shape=(2, 3)):
    return torch.arange(int(np.prod(shape)), dtype=f64).reshape(shape) * (k + 1) + k


def weights(k, shape):
    """Rank k's upstream gradient (for checks of backward)."""
    return torch.arange(int(np.prod(shape)), dtype=f64).reshape(shape) % 7 + 10 * k + 1


def rows_of(dim0, m, pos):
    return dim0 // m + (1 if pos < dim0 % m else 0)


def check_ops(ps, tag):
    ranks = ps.ranks
    m, pos = len(ranks), ranks.index(r)
    X = {k: data(k) for k in ranks}
    total = sum(X[k] for k in ranks)

    close(hvd.allreduce(X[r], process_set=ps), total / m, f"{tag} allreduce Average")
    close(hvd.allreduce(X[r], op=hvd.Sum, process_set=ps), total, f"{tag} allreduce Sum")
    close(hvd.synchronize(hvd.allreduce_async(X[r], op=hvd.Max, process_set=ps)),
          torch.stack([X[k] for k in ranks]).max(0).values, f"{tag} allreduce_async Max")
    t = X[r].clone()
    hvd.allreduce_(t, op=hvd.Sum, process_set=ps)
    close(t, total, f"{tag} allreduce_")
    outs = hvd.grouped_allreduce([X[r], X[r][0].float()], process_set=ps)
    close(outs[0], total / m, f"{tag} grouped_allreduce[0]")
    close(outs[1], (total / m)[0], f"{tag} grouped_allreduce[1]", tol=1e-6)
    bufs = [X[r].clone(), X[r][:, :1].contiguous()]
    hvd.grouped_allreduce_(bufs, op=hvd.Sum, process_set=ps)
    close(bufs[1], total[:, :1], f"{tag} grouped_allreduce_")

    G = {k: torch.arange(2 * (k + 1), dtype=torch.float32).reshape(k + 1, 2) + 100 * k
         for k in ranks}
    close(hvd.allgather(G[r], process_set=ps), torch.cat([G[k] for k in ranks]),
          f"{tag} allgather")
    outs = hvd.grouped_allgather([G[r], G[r][:, 0].contiguous()], process_set=ps)
    close(outs[1], torch.cat([G[k][:, 0] for k in ranks]), f"{tag} grouped_allgather")

    root = ranks[-1]
    close(hvd.broadcast(X[r], root, process_set=ps), X[root], f"{tag} broadcast")
    t = X[r].clone()
    hvd.synchronize(hvd.broadcast_async_(t, ranks[0], process_set=ps))
    close(t, X[ranks[0]], f"{tag} broadcast_async_")

    def splits_of(p):
        return [(p + j) % 2 + 1 for j in range(m)]

    def a2a(k):
        rows = sum(splits_of(ranks.index(k)))
        return torch.arange(rows, dtype=f64).reshape(rows, 1) + 1000 * k

    def segment(k, j):  # rows that member k sends to the member at position j
        s = splits_of(ranks.index(k))
        return slice(sum(s[:j]), sum(s[:j + 1]))

    out, recv = hvd.alltoall(a2a(r), splits=splits_of(pos), process_set=ps)
    close(out, torch.cat([a2a(k)[segment(k, pos)] for k in ranks]), f"{tag} alltoall splits")
    close(recv, torch.tensor([splits_of(ranks.index(k))[pos] for k in ranks]),
          f"{tag} alltoall received splits")
    close(hvd.alltoall(torch.arange(2.0 * m) + 10 * r, process_set=ps),
          torch.cat([torch.arange(2.0 * m)[2 * pos:2 * pos + 2] + 10 * k for k in ranks]),
          f"{tag} alltoall even")

    dim0 = 2 * m + 1
    R = {k: data(k, (dim0, 2)) for k in ranks}
    rtotal = sum(R[k] for k in ranks)
    lo = sum(rows_of(dim0, m, q) for q in range(pos))
    part = slice(lo, lo + rows_of(dim0, m, pos))
    close(hvd.reducescatter(R[r], op=hvd.Sum, process_set=ps), rtotal[part],
          f"{tag} reducescatter Sum")
    close(hvd.grouped_reducescatter([R[r]], process_set=ps)[0], rtotal[part] / m,
          f"{tag} grouped_reducescatter Average")

    sp = torch.sparse_coo_tensor(torch.tensor([[r % 3]]), torch.tensor([float(r + 1)]), (3,),
                             check_invariants=True)
    got = hvd.synchronize(hvd.sparse_allreduce_async(sp, name=None, op=hvd.Average,
                                                     process_set=ps)).to_dense()
    want = torch.zeros(3)
    for k in ranks:
        want[k % 3] += (k + 1) / m
    close(got, want, f"{tag} sparse_allreduce_async Average", tol=1e-6)
    hvd.barrier(process_set=ps)

    got = hvd.broadcast_object({"root": root} if r == root else None, root, process_set=ps)
    if got != {"root": root}:
        fail(f"{tag} broadcast_object: {got}")
    if hvd.allgather_object(r * 10, process_set=ps) != [k * 10 for k in ranks]:
        fail(f"{tag} allgather_object")

    # ---------------------------------------------------------------- gradients
    x = X[r].clone().requires_grad_()
    (hvd.allreduce(x, process_set=ps) * weights(r, x.shape)).sum().backward()
    close(x.grad, sum(weights(k, x.shape) for k in ranks) / m, f"{tag} allreduce gradient")

    x = X[r].clone().requires_grad_()
    (hvd.allreduce(x, op=hvd.Sum, process_set=ps) * weights(r, x.shape)).sum().backward()
    close(x.grad, sum(weights(k, x.shape) for k in ranks), f"{tag} allreduce Sum gradient")

    x = G[r].to(f64).requires_grad_()
    rows = sum(k + 1 for k in ranks)
    (hvd.allgather(x, process_set=ps) * weights(r, (rows, 2))).sum().backward()
    off = sum(k + 1 for k in ranks[:pos])
    close(x.grad, (sum(weights(k, (rows, 2)) for k in ranks) / m)[off:off + r + 1],
          f"{tag} allgather gradient (averaged, as horovod.torch)")

    x = X[r].clone().requires_grad_()
    (hvd.broadcast(x, root, process_set=ps) * weights(r, x.shape)).sum().backward()
    want = sum(weights(k, x.shape) for k in ranks) / m if r == root else torch.zeros(x.shape)
    close(x.grad, want, f"{tag} broadcast gradient")

    x = R[r].clone().requires_grad_()
    y = hvd.reducescatter(x, op=hvd.Average, process_set=ps)
    (y * weights(r, y.shape)).sum().backward()
    close(x.grad, torch.cat([weights(k, (rows_of(dim0, m, ranks.index(k)), 2)) for k in ranks]),
          f"{tag} reducescatter gradient (Horovod's: Average, no 1/size)")

    # grouped forms: the same gradients as the single forms, tensor by tensor
    xg, xr = G[r].to(f64).requires_grad_(), R[r].clone().requires_grad_()
    (yg,) = hvd.grouped_allgather([xg], process_set=ps)
    (yr,) = hvd.grouped_reducescatter([xr], op=hvd.Sum, process_set=ps)
    ((yg * weights(r, yg.shape)).sum() + (yr * weights(r, yr.shape)).sum()).backward()
    close(xg.grad, (sum(weights(k, (rows, 2)) for k in ranks) / m)[off:off + r + 1],
          f"{tag} grouped_allgather gradient")
    close(xr.grad, torch.cat([weights(k, (rows_of(dim0, m, ranks.index(k)), 2)) for k in ranks])
          * m, f"{tag} grouped_reducescatter Sum gradient (Horovod's: times the set's size)")

    x = a2a(r).requires_grad_()
    y, _ = hvd.alltoall(x, splits=splits_of(pos), process_set=ps)
    (y * weights(r, y.shape)).sum().backward()
    pieces = []
    for j, k in enumerate(ranks):  # my rows sent to member k come back from k's output
        got_rows = [splits_of(ranks.index(q))[j] for q in ranks]
        start = sum(got_rows[:pos])
        pieces.append(weights(k, (sum(got_rows), 1))[start:start + got_rows[pos]])
    close(x.grad, torch.cat(pieces), f"{tag} alltoall gradient")


def check_non_member(ps, tag):
    x = torch.ones(3)
    for what, fn in [
            ("allreduce", lambda: hvd.allreduce(x, process_set=ps)),
            ("allreduce_async_", lambda: hvd.allreduce_async_(x.clone(), process_set=ps)),
            ("grouped_allreduce", lambda: hvd.grouped_allreduce([x], process_set=ps)),
            ("allgather", lambda: hvd.allgather(x, process_set=ps)),
            ("grouped_allgather", lambda: hvd.grouped_allgather([x], process_set=ps)),
            ("broadcast", lambda: hvd.broadcast(x, ps.ranks[0], process_set=ps)),
            ("broadcast_", lambda: hvd.broadcast_(x.clone(), ps.ranks[0], process_set=ps)),
            ("alltoall", lambda: hvd.alltoall(torch.ones(ps.size()), process_set=ps)),
            ("reducescatter", lambda: hvd.reducescatter(x, process_set=ps)),
            ("grouped_reducescatter", lambda: hvd.grouped_reducescatter([x], process_set=ps)),
            ("barrier", lambda: hvd.barrier(process_set=ps)),
            ("broadcast_object", lambda: hvd.broadcast_object(1, ps.ranks[0], process_set=ps)),
            ("allgather_object", lambda: hvd.allgather_object(1, process_set=ps)),
            ("broadcast_parameters", lambda: hvd.broadcast_parameters(
                {"w": x.clone()}, ps.ranks[0], process_set=ps))]:
        expect_raises(ValueError, fn, f"{tag}: non-member {what}", match="not a member")


# ------------------------------------------------------------ collectives
if not isinstance(even, hvd.ProcessSet) or even.process_set_id != 1 or odd.process_set_id != 2:
    fail(f"sets {even}, {odd}")
check_ops(mine, f"set {mine.ranks}")  # both sets at once
check_non_member(other, f"set {other.ranks}")
expect_raises(ValueError, lambda: hvd.broadcast(torch.ones(2), other.ranks[0], process_set=mine),
              "root outside the set", match="not a member")
expect_raises(ValueError, lambda: hvd.broadcast_parameters({"w": torch.ones(2)}, other.ranks[0],
                                                           process_set=mine),
              "broadcast_parameters root outside the set")
expect_raises(TypeError, lambda: hvd.allreduce(torch.ones(2), process_set="even"), "a str as set")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), process_set=hvd.ProcessSet([0])),
    "DistributedOptimizer on an unregistered set", match="not registered")
close(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)),
      "global allreduce after set ops")

# ------------------------------------------------------------ model helpers on a set
def net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


def batch_of(k, step, rows=4):
    g = torch.Generator().manual_seed(100 * step + k)
    return torch.randn(rows, 6, generator=g), torch.randn(rows, 2, generator=g)


def stepped_sgd(model, k):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = batch_of(k, 0)
    F.mse_loss(model(x), y).backward()
    opt.step()
    return opt


root = mine.ranks[-1]
model = net(seed=r)
opt = stepped_sgd(model, r)
hvd.broadcast_parameters(model.state_dict(), root_rank=root, process_set=mine)
hvd.broadcast_optimizer_state(opt, root_rank=root, process_set=mine)
ref = net(seed=root)
ref_opt = stepped_sgd(ref, root)
for (name, p), q in zip(model.named_parameters(), ref.parameters()):
    close(p, q, f"broadcast_parameters on the set: {name}", tol=0.0)
for p, q in zip(model.parameters(), ref.parameters()):
    close(opt.state[p]["momentum_buffer"], ref_opt.state[q]["momentum_buffer"],
          "broadcast_optimizer_state on the set", tol=0.0)

# ------------------------------------------------------------ DistributedOptimizer on a set
def rel_err(a, b):
    return max(float((p - q).detach().abs().max() / q.detach().abs().max().clamp_min(1e-12))
               for p, q in zip(a.parameters(), b.parameters()))


def train(process_set, steps, group, side_work=None):
    """DistributedOptimizer(process_set) on this rank's batches against a
    reference on the combined batches of ``group`` (mean loss)."""
    model, ref = net(0), net(0)
    kwargs = {} if process_set is None else {"process_set": process_set}
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), **kwargs)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = batch_of(r, step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        if side_work is not None:
            side_work(step)
        opt.step()
        xs = torch.cat([batch_of(k, step)[0] for k in group])
        ys = torch.cat([batch_of(k, step)[1] for k in group])
        ref_opt.zero_grad()
        F.mse_loss(ref(xs), ys).backward()
        ref_opt.step()
    return model, ref


def odd_side_work(step):
    # ranks outside the optimizer's set keep running collectives on their own set
    close(hvd.allreduce(torch.full((2,), float(step)), op=hvd.Sum, process_set=odd),
          torch.full((2,), float(step * odd.size())), "side work on the other set")


in_even = even.included()
model, ref = train(even, 4, even.ranks if in_even else [r],
                   side_work=None if in_even else odd_side_work)
err = rel_err(model, ref)
if err > 1e-5:
    fail(f"DistributedOptimizer(process_set={even.ranks}) on rank {r} "
         f"({'member' if in_even else 'not a member'}): relative error {err}")
if in_even:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.unsqueeze(0), process_set=even)
    if not all(torch.equal(every[k], flat) for k in range(even.size())):
        fail("DistributedOptimizer on the set: parameters differ across members")
print(f"rank {r}: set optimizer relative error {err:.2e}", flush=True)

model, ref = train(None, 2, list(range(n)))
err = rel_err(model, ref)
if err > 1e-5:
    fail(f"global DistributedOptimizer after a set's: relative error {err}")
if not hvd.remove_process_set(odd):
    fail("remove_process_set(odd)")
done()

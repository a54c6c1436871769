"""commlib.torch.tensor_parallel and ParallelGrid on every rank. Modes:
``tp`` (2 ranks: tp=2), ``tp-dp`` (4 ranks: tp=2 x dp=2), ``pp-dp`` (4 ranks:
2 pipeline stages x 2 data-parallel replicas). A model built from the
parallel layers (VocabParallelEmbedding -> ColumnParallelLinear -> tanh ->
RowParallelLinear) gives the dense model's output and gradients (this
rank's slices) within 1e-5, through both the parallel and the gathered
paths, and 10 SGD steps on the global batch (split over the dp replicas)
end within 1e-5 relative of one process; argument errors are raised."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib
import commlib.torch as hvd
from _common import check_equal, done, expect_raises, fail
from commlib.torch.pipelining import PipelineStage, Schedule1F1B
from commlib.torch.tensor_parallel import (ColumnParallelLinear, RowParallelLinear,
                                           VocabParallelEmbedding)

torch.set_num_threads(1)
hvd.init()
MODE = sys.argv[1]
n = hvd.size()
grid = {"tp": lambda: hvd.ParallelGrid(tp=2), "tp-dp": lambda: hvd.ParallelGrid(dp=2, tp=2),
        "pp-dp": lambda: hvd.ParallelGrid(dp=2, pp=2)}[MODE]()
V, D, H, B, T, STEPS, LR = 12, 8, 16, 8, 5, 10, 0.2


class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.fc1, self.fc2 = nn.Embedding(V, D), nn.Linear(D, H), nn.Linear(H, D)

    def forward(self, ids):
        return self.fc2(torch.tanh(self.fc1(self.emb(ids)))).mean(dim=1)


class Parallel(nn.Module):
    def __init__(self, dense, ps, gathered=False):
        super().__init__()
        self.emb = VocabParallelEmbedding(V, D, process_set=ps).load_dense_(dense.emb.weight)
        self.fc1 = ColumnParallelLinear(D, H, gather_output=gathered, process_set=ps)
        self.fc2 = RowParallelLinear(H, D, input_is_parallel=not gathered, process_set=ps)
        self.fc1.load_dense_(dense.fc1.weight, dense.fc1.bias)
        self.fc2.load_dense_(dense.fc2.weight, dense.fc2.bias)

    def forward(self, ids):
        return self.fc2(torch.tanh(self.fc1(self.emb(ids)))).mean(dim=1)


def data(step):
    g = torch.Generator().manual_seed(700 + step)
    return torch.randint(0, V, (B * 2, T), generator=g), torch.randn(B * 2, D, generator=g)


def slices(par, dense, grads=False):
    """(parallel tensor, the dense tensor's slice for this rank) pairs."""
    get = (lambda p: p.grad) if grads else (lambda p: p.detach())
    e, c, r = par.emb, par.fc1, par.fc2
    return [(get(e.weight), get(dense.emb.weight)[e.offset:e.offset + e.part]),
            (get(c.weight), get(dense.fc1.weight)[c.offset:c.offset + c.part]),
            (get(c.bias), get(dense.fc1.bias)[c.offset:c.offset + c.part]),
            (get(r.weight), get(dense.fc2.weight)[:, r.offset:r.offset + r.part]),
            (get(r.bias), get(dense.fc2.bias))]


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def dp_average(params):
    if grid.dp > 1:
        for p in params:
            p.grad = hvd.allreduce(p.grad, op=hvd.Average, process_set=grid.dp_set)


def tensor_parallel():
    mine = slice(grid.dp_rank * B * 2 // grid.dp, (grid.dp_rank + 1) * B * 2 // grid.dp)
    for gathered in (False, True):
        dense, ids_y = Dense(), data(0)
        par = Parallel(dense, grid.tp_set, gathered)
        out, ref = par(ids_y[0]), dense(ids_y[0])
        check_equal(out.detach().numpy(), ref.detach().numpy(), "forward", rtol=1e-5, atol=1e-6)
        F.mse_loss(out, ids_y[1]).backward()
        F.mse_loss(ref, ids_y[1]).backward()
        for k, (a, b) in enumerate(slices(par, dense, grads=True)):
            if rel(a, b) > 1e-5:
                fail(f"gradient {k} (gathered={gathered}): relative error {rel(a, b):.2e}")
    dense, par = Dense(), Parallel(Dense(), grid.tp_set)
    opt, ref_opt = torch.optim.SGD(par.parameters(), lr=LR), torch.optim.SGD(dense.parameters(), lr=LR)
    for step in range(STEPS):
        if step == 3:
            before = commlib.response_cache_stats()
        ids, y = data(step)
        opt.zero_grad()
        ref_opt.zero_grad()
        F.mse_loss(par(ids[mine]), y[mine]).backward()
        dp_average(par.parameters())
        opt.step()
        F.mse_loss(dense(ids), y).backward()
        ref_opt.step()
    after = commlib.response_cache_stats()
    if grid.tp_set == hvd.global_process_set:
        # The layers name their three collectives a step once: from the third
        # step on they are cache hits (the cache serves the global set).
        if after["hits"] - before["hits"] < 3 * (STEPS - 3) or after["misses"] != before["misses"]:
            fail(f"tensor-parallel steps 3-{STEPS - 1}: cache {before} -> {after}")
    return max(rel(a, b) for a, b in slices(par, dense))


def pipeline_data_parallel():
    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                             nn.Linear(16, 3))

    def batch(step):
        g = torch.Generator().manual_seed(900 + step)
        return torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)

    ref, model = mlp(), mlp()
    part = model[:2] if grid.pp_rank == 0 else model[2:]
    stage = PipelineStage(part, grid.pp_rank, 2, process_set=grid.pp_set)
    sched = Schedule1F1B(stage, 4, F.mse_loss)
    opt, ref_opt = torch.optim.SGD(part.parameters(), lr=LR), torch.optim.SGD(ref.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step)
        mine = slice(grid.dp_rank * 8, (grid.dp_rank + 1) * 8)
        opt.zero_grad()
        sched.step(x[mine], target=y[mine])
        dp_average(part.parameters())
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
    ref_part = ref[:2] if grid.pp_rank == 0 else ref[2:]
    return max(rel(a.detach(), b.detach()) for a, b in zip(part.parameters(), ref_part.parameters()))


err = pipeline_data_parallel() if MODE == "pp-dp" else tensor_parallel()
if err > 1e-5:
    fail(f"{MODE}: parameters after {STEPS} steps differ by {err:.2e} (relative)")
errs = hvd.allgather(torch.tensor([err], dtype=torch.float64))
if hvd.rank() == 0:
    print(f"{MODE} {grid}: max relative parameter error after {STEPS} SGD steps "
          f"{float(errs.max()):.2e}", flush=True)

# ---- errors
expect_raises(ValueError, lambda: hvd.ParallelGrid(dp=3), "grid size", "job has")
expect_raises(ValueError, lambda: hvd.ParallelGrid(dp=0, tp=n), "dp=0", "positive int")
if MODE != "pp-dp":
    expect_raises(ValueError, lambda: ColumnParallelLinear(4, 5, process_set=grid.tp_set),
                  "uneven columns", "out_features (5) must divide evenly")
    expect_raises(ValueError, lambda: RowParallelLinear(7, 4, process_set=grid.tp_set),
                  "uneven rows", "in_features (7)")
    expect_raises(ValueError, lambda: VocabParallelEmbedding(11, 4, process_set=grid.tp_set),
                  "uneven vocabulary", "num_embeddings (11)")
hvd.barrier()
done()

"""3D parallelism (data x tensor x pipeline) with commlib.torch.ParallelGrid.

    commlibrun -np 4 python examples/parallel_3d.py --layout pp2dp2   # 2 stages x 2 replicas
    commlibrun -np 4 python examples/parallel_3d.py --layout tp2dp2   # 2-way tensor x 2-way data
    commlibrun -np 8 python examples/parallel_3d.py --layout pp2tp2dp2

The model is a stack of blocks (Linear -> tanh -> Linear). With pp > 1 the
blocks are cut into pipeline stages run by Schedule1F1B over ``grid.pp_set``;
with tp > 1 each block's first Linear is a ColumnParallelLinear and its second
a RowParallelLinear over ``grid.tp_set``; with dp > 1 every replica takes its
share of the global batch and the gradients are averaged over ``grid.dp_set``.
Every rank also trains the whole model in this process on the whole batches
and prints the largest relative difference between its parameters and that
one-process model's (its slice of them); it exits with status 1 above --tol.
"""
import argparse
import re
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from commlib.torch.pipelining import PipelineStage, Schedule1F1B
from commlib.torch.tensor_parallel import ColumnParallelLinear, RowParallelLinear

D, H = 8, 16  # features between blocks, hidden features inside a block


def parse_layout(text: str) -> dict:
    """'pp2dp2' -> {'dp': 2, 'tp': 1, 'pp': 2}."""
    parts = re.findall(r"(dp|tp|pp)(\d+)", text)
    if not parts or "".join(f"{k}{v}" for k, v in parts) != text or len({k for k, _ in parts}) < len(parts):
        raise argparse.ArgumentTypeError(f"layout {text!r}: expected e.g. pp2dp2, tp2dp2, pp2tp2dp2")
    sizes = {"dp": 1, "tp": 1, "pp": 1}
    sizes.update({k: int(v) for k, v in parts})
    return sizes


def dense_model(blocks: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(D, H), nn.Tanh(), nn.Linear(H, D))
                           for _ in range(blocks)])


def parallel_block(dense: nn.Sequential, grid):
    """This rank's copy of one dense block: the block itself when tp = 1, else
    its first Linear split by rows (ColumnParallelLinear) and its second by
    columns (RowParallelLinear) over the tensor-parallel set. Returns the
    module and ``slices(block)``: the tensors of a dense block that match the
    module's parameters, in order."""
    if grid.tp == 1:
        block = nn.Sequential(nn.Linear(D, H), nn.Tanh(), nn.Linear(H, D))
        block.load_state_dict(dense.state_dict())
        return block, lambda b: list(b.parameters())
    col = ColumnParallelLinear(D, H, process_set=grid.tp_set)
    row = RowParallelLinear(H, D, input_is_parallel=True, process_set=grid.tp_set)
    col.load_dense_(dense[0].weight, dense[0].bias)
    row.load_dense_(dense[2].weight, dense[2].bias)
    rows, cols = slice(col.offset, col.offset + col.part), slice(row.offset, row.offset + row.part)
    return (nn.Sequential(col, nn.Tanh(), row),
            lambda b: [b[0].weight[rows], b[0].bias[rows], b[2].weight[:, cols], b[2].bias])


def batch(step: int, size: int):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(size, D, generator=g), torch.randn(size, D, generator=g)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", type=parse_layout, default="pp2dp2",
                    help="grid sizes, e.g. pp2dp2, tp2dp2, pp2tp2dp2 (the product is the job size)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16, help="global batch (split over dp)")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    lay = args.layout
    if lay["dp"] * lay["tp"] * lay["pp"] != hvd.size():
        sys.exit(f"layout {lay} needs {lay['dp'] * lay['tp'] * lay['pp']} ranks, the job has "
                 f"{hvd.size()}")
    if args.batch % (lay["dp"] * args.microbatches):
        sys.exit(f"--batch {args.batch} must split evenly over dp={lay['dp']} replicas and "
                 f"{args.microbatches} microbatches")
    grid = hvd.ParallelGrid(dp=lay["dp"], tp=lay["tp"], pp=lay["pp"])

    ref = dense_model(2 * grid.pp)  # the one-process model: every block, the whole batch
    first = 2 * grid.pp_rank            # this pipeline stage holds blocks first, first + 1
    built = [parallel_block(b, grid) for b in dense_model(2 * grid.pp)[first:first + 2]]
    stage_module = nn.Sequential(*[m for m, _ in built])
    stage = PipelineStage(stage_module, grid.pp_rank, grid.pp, process_set=grid.pp_set)
    schedule = Schedule1F1B(stage, args.microbatches, F.mse_loss)
    params = list(stage_module.parameters())
    opt = torch.optim.SGD(params, lr=args.lr)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=args.lr)
    share = args.batch // grid.dp
    for step in range(args.steps):
        x, y = batch(step, args.batch)
        lo = grid.dp_rank * share
        opt.zero_grad()
        losses = []
        schedule.step(x[lo:lo + share], target=y[lo:lo + share], losses=losses)
        if grid.dp > 1:  # the replicas' mean gradient is the whole batch's
            grads = hvd.grouped_allreduce([q.grad for q in params], op=hvd.Average,
                                          process_set=grid.dp_set)
            for q, g in zip(params, grads):
                q.grad = g
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
        if losses and grid.dp_rank == 0 and grid.tp_rank == 0:
            print(f"step {step}: loss of replica 0's share {float(sum(losses) / len(losses)):.5f}",
                  flush=True)

    # this rank's parameters against the matching slices of the one-process model
    want = [t for (_, slices), b in zip(built, ref[first:first + 2]) for t in slices(b)]
    with torch.no_grad():
        err = max(float((q - w).abs().max() / w.abs().max().clamp_min(1e-12))
                  for q, w in zip(params, want))
    print(f"rank {hvd.rank()}: max relative difference from one process {err:.2e} "
          f"({grid})", flush=True)
    hvd.barrier()
    sys.exit(0 if err <= args.tol else 1)


if __name__ == "__main__":
    main()

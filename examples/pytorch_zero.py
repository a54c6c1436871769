"""Sharded data parallelism (ZeRO) with commlib.torch: trains a small MLP
classifier on synthetic data and prints the loss and every rank's memory
report (bytes held in parameters, gradients and optimizer state).

    commlibrun -np 2 python examples/pytorch_zero.py --zero-stage 3   # fully_shard
    commlibrun -np 2 python examples/pytorch_zero.py --zero-stage 2   # DistributedOptimizer
    commlibrun -np 2 python examples/pytorch_zero.py --zero-stage 0   # no sharding

Stages 1-2 wrap a torch optimizer with DistributedOptimizer(zero_stage=...);
stage 3 applies fully_shard to every block and the root, then builds a
plain torch optimizer over the shards.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    args = p.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)  # the same initial model on every rank
    w = args.width
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(w, w), nn.ReLU()) for _ in range(3))
    model = nn.Sequential(nn.Linear(32, w), nn.ReLU(), *blocks, nn.Linear(w, 10))
    if args.zero_stage == 3:
        for block in blocks:
            hvd.fully_shard(block)
        hvd.fully_shard(model)  # the first and last layers
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3),
                                       named_parameters=model.named_parameters(),
                                       zero_stage=args.zero_stage)
    teacher = torch.Generator().manual_seed(1)
    centers = torch.randn(10, 32, generator=teacher) * 0.3
    data = torch.Generator().manual_seed(100 + hvd.rank())  # each rank its own samples
    for step in range(args.steps):
        y = torch.randint(0, 10, (args.batch_size,), generator=data)
        x = centers[y] + torch.randn(args.batch_size, 32, generator=data)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == args.steps - 1:
            avg = hvd.allreduce(loss.detach(), name="loss").item()
            if hvd.rank() == 0:
                print(f"step {step}: loss {avg:.4f}", flush=True)
    mib = {k: round(v / 2**20, 3) for k, v in hvd.memory_report(model, opt).items()}
    print(f"rank {hvd.rank()}: memory (MiB, zero_stage {args.zero_stage}): {mib}", flush=True)


if __name__ == "__main__":
    main()

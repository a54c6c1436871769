"""Pipeline-parallel training with commlib.torch.pipelining.

    commlibrun -np 2 python examples/pipeline_torch.py --schedule 1F1B --microbatches 8

An 8-layer MLP is cut into one stage per rank (two per rank with
--schedule Interleaved1F1B); rank 0 feeds the batches, the last stage's rank
has the targets and prints the loss. At the end every rank compares its
layers with one process trained on the same batches.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from commlib.torch.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                      ScheduleInterleaved1F1B)

SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B, "Interleaved1F1B": ScheduleInterleaved1F1B}

ap = argparse.ArgumentParser()
ap.add_argument("--schedule", choices=list(SCHEDULES), default="1F1B")
ap.add_argument("--microbatches", type=int, default=4)
ap.add_argument("--steps", type=int, default=20)
args = ap.parse_args()
torch.set_num_threads(1)
hvd.init()
r, p = hvd.rank(), hvd.size()
v = 2 if args.schedule == "Interleaved1F1B" else 1


def model():
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(16, 16), nn.Tanh())])


full, ref = model(), model()
per = len(full) // (p * v)
stages = [PipelineStage(full[s * per:(s + 1) * per], s, p * v) for s in range(r, p * v, p)]
schedule = SCHEDULES[args.schedule](stages if v > 1 else stages[0], args.microbatches, F.mse_loss)
params = [q for st in stages for q in st.module.parameters()]
opt, ref_opt = torch.optim.SGD(params, lr=0.05), torch.optim.SGD(ref.parameters(), lr=0.05)
for step in range(args.steps):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(32, 16, generator=g), torch.randn(32, 16, generator=g)
    opt.zero_grad()
    losses = []
    schedule.step(x, target=y, losses=losses)
    opt.step()
    if losses:
        print(f"step {step}: loss {float(sum(losses) / len(losses)):.4f}", flush=True)
    ref_opt.zero_grad()
    F.mse_loss(ref(x), y).backward()
    ref_opt.step()
mine = {id(q) for q in params}
pairs = [(a, b) for a, b in zip(full.parameters(), ref.parameters()) if id(a) in mine]
err = max(float((a - b).abs().max() / b.abs().max()) for a, b in pairs)
print(f"rank {r}: max relative difference from one process {err:.2e}", flush=True)

"""Bytes one training step allreduces, as the core reports them in its
timeline (each allreduce's "bytes"), for the synthetic benchmark's MLP (12.6M
parameters) and ResNet-18 (11.7M; on 32x32 images, which change no
gradient's size): plain DistributedOptimizer against
Compression.powersgd(rank=2) once compression has started. Prints both and
their ratio per model; fails below 20x."""
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import commlib.torch as hvd
from _common import done
from powersgd_bytes_common import report, step_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import synthetic_models  # noqa: E402

torch.set_num_threads(1)
hvd.init()
r = hvd.rank()
trace = sys.argv[1]


def run(kind, compression, what):
    """Allreduced bytes of this rank in the third step (PowerSGD: the second
    compressed one) with ``compression``."""
    torch.manual_seed(0)
    model, x, y = synthetic_models.make(kind, "cpu", 4)
    if kind == "resnet18":
        x = torch.randn(4, 3, 32, 32)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return (step_bytes(f"{trace}.{kind}.{what}", r, [step] * 3, f"{kind} {what}"),
            sum(p.numel() for p in model.parameters()))


for kind in ("mlp", "resnet18"):
    sync, params = run(kind, hvd.Compression.none, "sync")
    psgd, _ = run(kind, hvd.Compression.powersgd(rank=2, start_step=1), "powersgd")
    report(r, kind, params, sync, psgd)
done()

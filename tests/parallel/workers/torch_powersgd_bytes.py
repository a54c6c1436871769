"""Bytes one training step allreduces, as the core reports them in its
timeline (each allreduce's "bytes"), for the synthetic benchmark's MLP (12.6M
parameters): plain DistributedOptimizer against Compression.powersgd(rank=2)
once compression has started. Prints both and their ratio; fails below 20x."""
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import commlib
import commlib.torch as hvd
from commlib.timeline import load_events
from _common import done, fail

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import synthetic_models  # noqa: E402

torch.set_num_threads(1)
hvd.init()
r = hvd.rank()
trace = sys.argv[1]


def step_bytes(compression, what):
    """Allreduced bytes of this rank in the third step (PowerSGD: the second
    compressed one) with ``compression``."""
    torch.manual_seed(0)
    model, x, y = synthetic_models.make("mlp", "cpu", 4)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    for step in range(3):
        if step == 2:
            commlib.start_timeline(f"{trace}.{what}.json")
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    commlib.stop_timeline()
    stem = f"{trace}.{what}"
    mine = f"{stem}.json" if r == 0 else f"{stem}.rank{r}.json"
    events = [e for e in load_events(mine) if e.get("ph") == "X" and e["name"] == "allreduce"]
    if not events:
        fail(f"{what}: no allreduce in the timeline")
    params = sum(p.numel() for p in model.parameters())
    return sum(e["args"]["bytes"] for e in events), params


sync, params = step_bytes(hvd.Compression.none, "sync")
psgd, _ = step_bytes(hvd.Compression.powersgd(rank=2, start_step=1), "powersgd")
ratio = sync / psgd
print(f"rank {r}: parameters {params}, bytes per step: sync {sync}, powersgd rank 2 {psgd}, "
      f"ratio {ratio:.1f}", flush=True)
if sync < 4 * params:
    fail(f"sync step allreduced {sync} bytes, fewer than the {4 * params} of the gradients")
if ratio < 20:
    fail(f"PowerSGD rank 2 sends only {ratio:.1f}x fewer bytes than sync")
done()

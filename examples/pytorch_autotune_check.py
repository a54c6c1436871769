"""Autotune against hand-picked fusion thresholds on the synthetic benchmark's
model (synthetic_models.py: the MLP of 12.5M parameters, batch 32, SGD,
one thread per rank), in one run:
1. with autotune on: steps until every rank applied autotune's final setting
   (samples/s of every 20 steps on the way);
2. then, alternating in blocks under the same load: autotune's fusion threshold
   and each hand-picked one (set through commlib_set_fusion_threshold, which
   every rank applies at the same point), ROUNDS rounds of 3 + TIMED steps
   each; the hand-picked ones keep autotune's cycle time.

    COMMLIB_FUSION_THRESHOLD=0 commlibrun -np 2 --autotune --autotune-log-file tune.csv \
        python examples/pytorch_autotune_check.py 8 5      # ROUNDS TIMED
"""
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synthetic_models  # noqa: E402

import commlib  # noqa: E402
import commlib.torch as hvd  # noqa: E402

ROUNDS, WARM, TIMED = int(sys.argv[1]), 3, int(sys.argv[2])
torch.set_num_threads(1)
torch.manual_seed(0)
hvd.init()
lib = commlib._lib.lib
model, data, target = synthetic_models.make("mlp", "cpu", 32)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                               named_parameters=model.named_parameters())


def step():
    opt.zero_grad()
    F.cross_entropy(model(data), target).backward()
    opt.step()


def agree(flag, name):
    return bool(hvd.allreduce(torch.tensor([int(flag)], dtype=torch.int32), op=hvd.Min, name=name).item())


def log(msg):
    if hvd.rank() == 0:
        print(msg, flush=True)


times, k = [], 0
while True:
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
    k += 1
    if agree(any(h["final"] for h in commlib.autotune_history()), "final") or k >= 400:
        break
hist = commlib.autotune_history()
final = hist[-1]
log(f"autotune: final setting applied after step {k}: fusion {final['fusion_threshold']} B, cycle "
    f"{final['cycle_time_ms']} ms, tree {final['tree_max_bytes']} B ({len(hist)} changes)")
for a in range(0, k, 20):
    log(f"  steps {a}-{min(a + 20, k) - 1}: {32 / np.median(times[a:a + 20]):.1f} samples/s per rank (median step)")

MiB = 1 << 20
settings = {"autotune": final["fusion_threshold"], "0": 0, "1MiB": MiB, "4MiB": 4 * MiB, "16MiB": 16 * MiB,
            "64MiB": 64 * MiB}
rates = {name: [] for name in settings}
for rnd in range(ROUNDS):
    for name, thr in settings.items():
        if hvd.rank() == 0:
            lib.commlib_set_fusion_threshold(thr)
        while not agree(lib.commlib_fusion_threshold() == thr, "applied"):
            step()
        for _ in range(WARM):
            step()
        hvd.barrier()
        t0 = time.perf_counter()
        for _ in range(TIMED):
            step()
        rates[name].append(32 * TIMED / (time.perf_counter() - t0))
    log(f"round {rnd}: " + ", ".join(f"{n} {r[-1]:.1f}" for n, r in rates.items()))
best_hand = max((np.median(r), n) for n, r in rates.items() if n != "autotune")
auto = np.median(rates["autotune"])
log("median samples/s per rank: " + ", ".join(f"{n} {np.median(r):.1f}" for n, r in rates.items()))
log("mean samples/s per rank: " + ", ".join(f"{n} {np.mean(r):.1f}" for n, r in rates.items()))
log(f"autotune / best hand-picked ({best_hand[1]}): {auto / best_hand[0]:.3f}")

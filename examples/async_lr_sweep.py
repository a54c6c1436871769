"""Learning-rate sweep of sync versus delayed averaging on the task of
pytorch_async_curves.py, in one process (no commlib job needed).

A single-process simulation of the rules that the library implements (the
exactness tests check the library against the same simulation): with R
simulated ranks, the gradient of a step is the average of the R ranks'
gradients on their own batches; sync applies it at once, staleness 1 one
step later (nothing at step 0, the last one at the end, as synchronize()
does), and staleness 1 with weight prediction takes the gradients at
p + (p - p_prev). Data, initialisation, schedule (warm-up, linear decay) and
evaluation are the example's, so ``--lrs 3e-3 --seeds 2`` prints the same
numbers as ``commlibrun -np 2 python examples/pytorch_async_curves.py
--seeds 2 --modes sync,staleness1,staleness1-predict``.

    python examples/async_lr_sweep.py --lrs 1e-3,3e-3,1e-2,2e-2 --seeds 8
"""
import argparse
import statistics

import torch
import torch.nn.functional as F

from pytorch_async_curves import lr_factor, student, teacher_data

MODES = ("sync", "staleness1", "staleness1-predict")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lrs", default="1e-3,3e-3,1e-2")
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warmup", type=float, default=0.05)
    p.add_argument("--noise", type=float, default=0.05)
    return p.parse_args()


def mean_gradient(model, batches):
    """The average over the ranks of their gradients at ``model``."""
    total = None
    for x, y in batches:
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
    return [g / len(batches) for g in total]


def train(mode, args, seed, data, held_out):
    """The final held-out loss of one mode."""
    model = student(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    pending, prev = None, None
    for t in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = args.lr * lr_factor(t, args)
        lo, hi = t * args.batch_size, (t + 1) * args.batch_size
        true = None
        if mode == "staleness1-predict" and prev is not None:
            true = [p.detach().clone() for p in model.parameters()]
            with torch.no_grad():
                for p, q in zip(model.parameters(), prev):
                    p.add_(p - q)
        grads = mean_gradient(model, [(x[lo:hi], y[lo:hi]) for x, y in data])
        if true is not None:
            with torch.no_grad():
                for p, q in zip(model.parameters(), true):
                    p.copy_(q)
        apply, pending = (grads, None) if mode == "sync" else (pending, grads)
        prev = None
        if apply is not None:
            prev = [p.detach().clone() for p in model.parameters()]
            for p, g in zip(model.parameters(), apply):
                p.grad = g
            opt.step()
    if pending is not None:
        for p, g in zip(model.parameters(), pending):
            p.grad = g
        opt.step()
    with torch.no_grad():
        return float(F.mse_loss(model(held_out[0]), held_out[1]))


def main():
    args = parse_args()
    torch.set_num_threads(1)
    held_out = teacher_data(4096, seed=99, noise=args.noise)
    print(f"{args.ranks} simulated ranks, {args.steps} steps x {args.batch_size} samples, "
          f"warm-up {args.warmup:g}, {args.seeds} seeds: final held-out MSE, gap to sync "
          f"(mean +- standard error)")
    for lr in map(float, args.lrs.split(",")):
        args.lr = lr
        finals = {m: [] for m in MODES}
        for seed in range(args.seeds):
            data = [teacher_data(args.steps * args.batch_size, seed=100 + r + 1000 * seed,
                                 noise=args.noise) for r in range(args.ranks)]
            for m in MODES:
                finals[m].append(train(m, args, seed, data, held_out))
        line = f"lr {lr:g}: sync {statistics.mean(finals['sync']):.5f}"
        for m in MODES[1:]:
            gaps = [100 * (v / s - 1) for v, s in zip(finals[m], finals["sync"])]
            se = statistics.stdev(gaps) / len(gaps) ** 0.5 if len(gaps) > 1 else 0.0
            line += f"; {m} {statistics.mean(finals[m]):.5f} ({statistics.mean(gaps):+.2f}% +- {se:.2f})"
        print(line, flush=True)


if __name__ == "__main__":
    main()

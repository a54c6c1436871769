"""Synchronous versus asynchronous gradient exchange on a small real task:
loss curves of sync, delayed averaging (staleness 1), local SGD and DiLoCo.

The task: regression of a fixed random teacher network (16 inputs, two tanh
layers) plus noise, learned by a small MLP; every rank draws its own training
samples from its own seed, and all modes see the same samples in the same
order. Each mode trains a fresh copy of the same initial model for
``--steps`` steps of ``--batch-size`` samples per rank (inner optimizer AdamW
for every mode, its learning rate warmed up linearly over the first
``--warmup`` of the steps, then decaying linearly to 0; DiLoCo's outer
optimizer is SGD lr 0.7, momentum 0.9, Nesterov, as in the DiLoCo paper),
and the held-out loss (mean squared error; the noise floor is
``--noise``**2) is measured every ``--eval-every`` steps (a multiple of
``--period``, so local-SGD replicas have just met).

    commlibrun -np 2 python examples/pytorch_async_curves.py --out async_curves.png

Writes the PNG with matplotlib (``pip install matplotlib``; without it only
the table is printed) and prints the final losses relative to sync; with
``--seeds K`` every mode is trained for K seeds (student initialisation and
training samples) and the mean gap to sync, its standard error and its
spread are printed. Mode staleness1-predict is staleness 1 with
``weight_prediction=True`` (gradients taken at p + (p - p_prev)); mode
powersgd<R> (e.g. powersgd2) is sync with PowerSGD rank-R compression.
"""
import argparse
import copy
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd

MODES = ("sync", "staleness1", "staleness1-predict", "local-sgd", "diloco")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=800, help="steps per rank")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup", type=float, default=0.05,
                   help="fraction of the steps with a linear learning-rate warm-up")
    p.add_argument("--period", type=int, default=8, help="local SGD / DiLoCo: H")
    p.add_argument("--eval-every", type=int, default=40)
    p.add_argument("--noise", type=float, default=0.05)
    p.add_argument("--modes", default=",".join(MODES),
                   help="also staleness1-predict (weight_prediction=True), local-sgd-stream, "
                        "diloco-stream (LocalSGD(streaming=True)), powersgd<R> "
                        "(compression=Compression.powersgd(rank=R, start_step=10))")
    p.add_argument("--seed", type=int, default=0,
                   help="shifts the student's initialisation and the training samples")
    p.add_argument("--seeds", type=int, default=1,
                   help="train every mode for this many seeds (from --seed) and report the "
                        "mean gap to the first mode and its spread; the PNG shows the first")
    p.add_argument("--out", default="", help="PNG path for the loss curves (rank 0)")
    return p.parse_args()


def teacher_data(rows, seed, noise):
    """(x, y) of the task: a fixed teacher (seed 0) on inputs from ``seed``."""
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                            nn.Linear(32, 1))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 16, generator=g)
    with torch.no_grad():
        y = teacher(x) * 2 + noise * torch.randn(rows, 1, generator=g)
    return x, y


def student(seed=0):
    torch.manual_seed(1 + seed)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 1))


def optimizer_for(mode, model, args):
    """(the optimizer to step, the inner optimizer whose learning rate decays)."""
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if mode in ("sync", "staleness1", "staleness1-predict"):
        return hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(),
                                        staleness=int(mode != "sync"),
                                        weight_prediction=mode == "staleness1-predict"), inner
    if mode.startswith("powersgd") and mode[len("powersgd"):].isdigit():
        psgd = hvd.Compression.powersgd(rank=int(mode[len("powersgd"):]), start_step=10)
        return hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(),
                                        compression=psgd), inner
    if mode not in ("local-sgd", "diloco", "local-sgd-stream", "diloco-stream"):
        raise SystemExit(f"unknown mode {mode!r}")
    outer = (torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
             if mode.startswith("diloco") else None)
    return hvd.LocalSGD(inner, model, period=args.period, outer_optimizer=outer,
                        streaming=mode.endswith("-stream")), inner


def lr_factor(t, args):
    """Linear warm-up over the first ``--warmup`` of the steps, then linear
    decay to 0 at the end."""
    warm = int(args.warmup * args.steps)
    if t < warm:
        return (t + 1) / warm
    return 1 - t / args.steps


def train(mode, args, data, held_out):
    """[(samples seen by all ranks, held-out loss)] and the final loss."""
    model = student(args.seed)
    opt, inner = optimizer_for(mode, model, args)
    x, y = data
    curve = []

    def evaluate():
        with torch.no_grad():
            return float(F.mse_loss(model(held_out[0]), held_out[1]))

    for t in range(args.steps):
        lo = t * args.batch_size
        for group in inner.param_groups:  # the same schedule for every mode
            group["lr"] = args.lr * lr_factor(t, args)
        opt.zero_grad()
        F.mse_loss(model(x[lo:lo + args.batch_size]), y[lo:lo + args.batch_size]).backward()
        opt.step()
        if (t + 1) % args.eval_every == 0:
            curve.append(((t + 1) * args.batch_size * hvd.size(), evaluate()))
    opt.synchronize()
    return curve, evaluate()


def plot(curves, args, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no PNG written")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, (curve, _) in curves.items():
        ax.plot([s for s, _ in curve], [v for _, v in curve], label=mode)
    ax.axhline(args.noise ** 2, color="gray", linestyle=":", label="noise floor")
    ax.set_yscale("log")
    ax.set_xlabel("training samples (all ranks)")
    ax.set_ylabel("held-out MSE")
    ax.set_title(f"{hvd.size()} ranks, batch {args.batch_size}/rank, H={args.period}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def run_seed(args, seed):
    """{mode: (curve, final loss)} and the initial loss, for one seed."""
    args.seed = seed
    data = teacher_data(args.steps * args.batch_size, seed=100 + hvd.rank() + 1000 * seed,
                        noise=args.noise)
    held_out = teacher_data(4096, seed=99, noise=args.noise)
    curves = {mode: train(mode, args, data, held_out) for mode in args.modes.split(",")}
    start = float(F.mse_loss(copy.deepcopy(student(seed))(held_out[0]), held_out[1]).detach())
    return curves, start


def report(finals, start, args):
    """Per mode: the mean final loss over the seeds and its gap to the first
    mode's (mean, standard error of the mean and spread over the seeds)."""
    ref = next(iter(finals))
    print(f"held-out MSE: initial {start:.4g}, noise floor {args.noise ** 2:.4g}")
    for mode, values in finals.items():
        gaps = [100 * (v / r - 1) for v, r in zip(values, finals[ref])]
        mean = statistics.mean(gaps)
        sd = statistics.stdev(gaps) if len(gaps) > 1 else 0.0
        spread = (f" +- {sd / len(gaps) ** 0.5:.2f} (se), sd {sd:.1f}, range "
                  f"{min(gaps):+.1f}..{max(gaps):+.1f}" if len(gaps) > 1 else "")
        print(f"final {mode}: {statistics.mean(values):.5g} ({mean:+.2f}% vs {ref}{spread}; "
              f"{len(values)} seed(s))")


def main():
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    if args.eval_every % args.period:
        raise SystemExit("--eval-every must be a multiple of --period")
    if not 0 <= args.warmup < 1:
        raise SystemExit("--warmup must be a fraction of the steps in [0, 1)")
    finals, first_curves, first_start = {}, None, None
    for seed in range(args.seed, args.seed + args.seeds):
        curves, start = run_seed(args, seed)
        first_curves, first_start = first_curves or curves, first_start or start
        for mode, (_, final) in curves.items():
            finals.setdefault(mode, []).append(final)
    if hvd.rank() != 0:
        return
    report(finals, first_start, args)
    if args.out:
        plot(first_curves, args, args.out)


if __name__ == "__main__":
    main()

"""PowerSGD across slow links: step time, bytes per step and loss against
wall-clock time for sync, fp16, PowerSGD rank 1, 2 and 4 and DiLoCo (H = 8),
with "local" (no exchange: the compute alone) beside them.

Every mode trains its own copy of the synthetic benchmark's MLP (12.5 M
parameters, synthetic_models.py; ``--model small-mlp``: 0.3 M) on a learnable task (random inputs labelled
by a fixed random linear teacher, 10 of the 1000 outputs), SGD (lr 0.05); the modes
take turns, ``--period`` steps each, so that they share the same load. The
first turn of each mode is a warm-up (PowerSGD's plain phase: ``start_step``
is the period); the step time is the mean over the later turns (a DiLoCo
meeting included), the bytes per step are what the core's timeline records
over one more turn of every mode (rank 0), and the loss is the training loss
of every step, averaged over the ranks, against the mode's own accumulated
step time. On two emulated hosts of one rank each, links limited by tc:

    python tests/parallel/netns_hosts.py --rate 1gbit -- "$(command -v python3)" \\
        examples/powersgd_links.py --label "1 Gbit/s" --out examples/results/powersgd_1gbit.json
    # the same with --rate 10gbit; --batch-size 4 for a communication-bound setting

Then the PNG (needs matplotlib: ``pip install 'commlib[plot]'`` or ``pip
install matplotlib``):

    python examples/powersgd_links.py --plot examples/results/powersgd_*.json \\
        --png examples/results/powersgd_links.png
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

import synthetic_models

MODES = ("local", "sync", "fp16", "powersgd1", "powersgd2", "powersgd4", "diloco")
SIZES = {"mlp": [1024, 2048, 2048, 2048, 1000],  # as synthetic_models.py
         "small-mlp": [256, 512, 256, 100]}
CLASSES = 10


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--model", choices=sorted(SIZES), default="mlp")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--period", type=int, default=8,
                   help="steps of a turn; DiLoCo's H and PowerSGD's start_step")
    p.add_argument("--turns", type=int, default=4, help="turns of every mode, the first a warm-up")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--label", default="", help="the setting, for the table and the PNG")
    p.add_argument("--out", default="", help="JSON file of the measurements (rank 0)")
    p.add_argument("--plot", nargs="+", metavar="JSON", help="draw these measurements, train nothing")
    p.add_argument("--png", default="powersgd_links.png", help="with --plot: the PNG to write")
    args = p.parse_args(argv)
    if args.turns < 2:
        p.error("--turns must be at least 2 (the first is a warm-up)")
    return args


# ------------------------------------------------------------ training


def optimizer_for(mode, model, args):
    import commlib.torch as hvd

    inner = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    if mode == "local":
        return inner
    if mode == "diloco":
        outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        return hvd.LocalSGD(inner, model, period=args.period, outer_optimizer=outer)
    if mode.startswith("powersgd") and mode[len("powersgd"):].isdigit():
        compression = hvd.Compression.powersgd(rank=int(mode[len("powersgd"):]),
                                               start_step=args.period)
    elif mode in ("sync", "fp16"):
        compression = hvd.Compression.fp16 if mode == "fp16" else hvd.Compression.none
    else:
        raise SystemExit(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
    return hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(),
                                    compression=compression)


class Task:
    """Batches of random inputs labelled by a fixed random linear teacher
    (the same teacher on every rank, each rank its own inputs) with the
    first ``CLASSES`` of the model's 1000 outputs."""

    def __init__(self, rank, batch_size, inputs):
        g = torch.Generator().manual_seed(7)
        self.teacher = torch.randn(inputs, CLASSES, generator=g)
        self.gen = torch.Generator().manual_seed(1000 + rank)
        self.batch_size = batch_size

    def batch(self):
        x = torch.randn(self.batch_size, self.teacher.shape[0], generator=self.gen)
        return x, (x @ self.teacher).argmax(1)


def turn(model, opt, task, steps, times, losses):
    """``steps`` training steps; appends each step's seconds and loss."""
    for _ in range(steps):
        x, y = task.batch()
        start = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        losses.append(float(loss.detach()))


def allreduced_bytes(path):
    """Bytes in this rank's timeline file (every collective's event)."""
    from commlib.timeline import load_events

    return sum(e.get("args", {}).get("bytes", 0) for e in load_events(path) if e.get("ph") == "X")


def measure(args):
    import commlib
    import commlib.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    sizes = SIZES[args.model]
    pristine = synthetic_models.mlp(sizes)
    modes = args.modes.split(",")
    runs = {}
    for mode in modes:
        model = synthetic_models.mlp(sizes)
        model.load_state_dict(pristine.state_dict())
        runs[mode] = (model, optimizer_for(mode, model, args),
                      Task(hvd.rank(), args.batch_size, sizes[0]), [], [])
    for t in range(args.turns):
        for mode, (model, opt, task, times, losses) in runs.items():
            hvd.barrier()
            turn(model, opt, task, args.period, times, losses)
        if hvd.rank() == 0:
            print(f"turn {t}: " + ", ".join(
                f"{m} {1e3 * sum(r[3][-args.period:]) / args.period:.0f}" for m, r in runs.items())
                + " ms per step", flush=True)
    per_step = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, (model, opt, task, _, _) in runs.items():
            hvd.barrier()
            path = os.path.join(tmp, f"{mode}.json")
            commlib.start_timeline(path)
            turn(model, opt, task, args.period, [], [])
            commlib.stop_timeline()
            mine = path if hvd.rank() == 0 else path[:-len(".json")] + f".rank{hvd.rank()}.json"
            per_step[mode] = allreduced_bytes(mine) / args.period
    warm = args.period
    result = {"label": args.label, "model": args.model, "batch_size": args.batch_size,
              "ranks": hvd.size(),
              "period": args.period, "modes": {}}
    for mode, (_, _, _, times, losses) in runs.items():
        mean_ms = 1e3 * sum(times[warm:]) / len(times[warm:])
        mean_ms = hvd.allreduce(torch.tensor([mean_ms], dtype=torch.float64)).item()
        loss = hvd.allreduce(torch.tensor(losses, dtype=torch.float64), name=f"loss.{mode}")
        clock, total = [], 0.0
        for s in times:
            total += s
            clock.append(total)
        result["modes"][mode] = {"step_ms": mean_ms, "bytes_per_step": per_step[mode],
                                 "loss": loss.tolist(), "seconds": clock}
    if hvd.rank() == 0:
        report(result)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f)
            print(f"wrote {args.out}")


def report(result):
    modes = result["modes"]
    sync = modes.get("sync", {}).get("step_ms")
    print(f"{result['label']}, batch {result['batch_size']} per rank, {result['ranks']} ranks:")
    for mode, m in modes.items():
        ratio = f" ({m['step_ms'] / sync:.2f}x sync)" if sync else ""
        last = m["loss"][-result["period"]:]
        print(f"  {mode:10s} {m['step_ms']:7.1f} ms per step{ratio}, "
              f"{m['bytes_per_step'] / 1e3:9.1f} KB per step, loss of the last turn "
              f"{sum(last) / len(last):.3f}")


# ------------------------------------------------------------ the PNG


def plot(paths, png):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("matplotlib is not installed: pip install 'commlib[plot]' (or pip install "
                 "matplotlib)")
    results = []
    for path in paths:
        with open(path) as f:
            results.append(json.load(f))
    names = [f"{r['label']}, batch {r['batch_size']}" for r in results]
    modes = list(results[0]["modes"])
    rows = 1 + (len(results) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.6 * rows), squeeze=False)
    ax = axes[0][0]
    width = 0.8 / len(results)
    for i, (r, name) in enumerate(zip(results, names)):
        ax.bar([k + i * width for k in range(len(modes))],
               [r["modes"][m]["step_ms"] for m in modes], width, label=name)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(modes))], modes, rotation=30)
    ax.set_ylabel("ms per step (mean)")
    ax.set_title("step time")
    ax.legend(fontsize=7)
    ax = axes[0][1]
    sent = [m for m in modes if results[0]["modes"][m]["bytes_per_step"] > 0]
    values = [results[0]["modes"][m]["bytes_per_step"] for m in sent]
    bars = ax.bar(sent, values)
    ax.bar_label(bars, [f"{v / 1e6:.2g} MB" if v >= 1e6 else f"{v / 1e3:.0f} KB" for v in values],
                 fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("bytes allreduced per step, rank 0")
    ax.set_title("bytes per step (core's timeline; DiLoCo: a meeting / H)")
    ax.tick_params(axis="x", rotation=30)
    for i, (r, name) in enumerate(zip(results, names)):
        ax = axes[1 + i // 2][i % 2]
        for m in modes:
            ax.plot(r["modes"][m]["seconds"], smooth(r["modes"][m]["loss"]), label=m)
        ax.set_xlabel("wall-clock seconds of the mode's own steps")
        ax.set_ylabel("training loss (mean of 8 steps)")
        ax.set_title(name)
        ax.legend(fontsize=7)
    for i in range(len(results), 2 * (rows - 1)):
        axes[1 + i // 2][i % 2].axis("off")
    fig.tight_layout()
    fig.savefig(png, dpi=70)
    print(f"wrote {png}")


def smooth(values, k=8):
    out = []
    for i in range(len(values)):
        window = values[max(0, i - k + 1):i + 1]
        out.append(sum(window) / len(window))
    return out


if __name__ == "__main__":
    ARGS = parse_args()
    if ARGS.plot:
        plot(ARGS.plot, ARGS.png)
    else:
        measure(ARGS)

"""Synthetic training throughput: commlib.torch versus torch DDP (gloo).

Trains a model on random data (no input pipeline) and prints samples/s, in
the style of Horovod's pytorch_synthetic_benchmark.py. The default model is
an MLP with about 12.6 million parameters (1024 -> 2048 -> 2048 -> 2048 ->
1000), batch 32 per rank, one torch thread per rank.

    commlibrun -np 2 python examples/pytorch_synthetic_benchmark.py --backend commlib
    commlibrun -np 2 python examples/pytorch_synthetic_benchmark.py --backend ddp
    torchrun --nproc_per_node 2 examples/pytorch_synthetic_benchmark.py --backend ddp
    python examples/pytorch_synthetic_benchmark.py --backend commlib     # 1 rank baseline

Asynchronous exchange (commlib): ``--mode`` sync (default), staleness1
(DistributedOptimizer(staleness=1)), local-sgd / diloco (LocalSGD with
``--period`` H; local-sgd-stream / diloco-stream: streaming meetings), local
(no communication at all: the ceiling), or several
comma-separated: then each mode gets its own copy of the model and the modes
take turns within every iteration, so they are compared in the same run
under the same load:

    commlibrun -np 2 python examples/pytorch_synthetic_benchmark.py \
        --mode sync,staleness1,local-sgd,local --period 8

Sharded data parallelism: modes zero1 and zero2 (DistributedOptimizer with
zero_stage 1 or 2) and zero3 (fully_shard on every layer, a plain optimizer
over the shards); ``--zero-stage N`` is ``--mode zeroN``. Every rank prints
its memory report for each mode. ``--optimizer adam`` gives the optimizer
state that ZeRO shards (SGD without momentum has none):

    commlibrun -np 2 python examples/pytorch_synthetic_benchmark.py \
        --mode sync,zero1,zero2,zero3 --optimizer adam

With ``--backend ddp`` the rank and world size come from torchrun's RANK /
WORLD_SIZE, or from MPI's launcher environment (PMI_RANK/PMI_SIZE for MPICH,
OMPI_COMM_WORLD_RANK/SIZE for Open MPI) when started by commlibrun;
MASTER_ADDR/MASTER_PORT default to 127.0.0.1:29500.
"""
import argparse
import copy
import os
import sys
import time
import timeit

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["commlib", "ddp"], default="commlib")
    p.add_argument("--model", choices=["mlp", "small-mlp"], default="mlp",
                   help="mlp: 12.6M parameters; small-mlp: 0.3M (for smoke tests)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--num-threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--fp16-allreduce", action="store_true", help="commlib: fp16 compression")
    p.add_argument("--groups", type=int, default=0,
                   help="commlib: fuse gradients into this many groups (0: one per parameter)")
    p.add_argument("--mode", default="sync",
                   help="commlib: comma-separated of sync, staleness1, local-sgd, diloco, local")
    p.add_argument("--period", type=int, default=8, help="local-sgd/diloco: steps per meeting")
    p.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2, 3],
                   help="commlib: the same as --mode zero<N> (0: --mode as given)")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    args = p.parse_args()
    if args.zero_stage:
        args.mode = f"zero{args.zero_stage}"
    return args


def make_model(kind):
    if kind == "mlp":
        sizes = [1024, 2048, 2048, 2048, 1000]
    else:
        sizes = [256, 512, 256, 100]
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def env_int(*names, default=None):
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return default


def make_optimizer(args, params, scale):
    if args.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-4 * scale)
    return torch.optim.SGD(params, lr=0.01 * scale)


def setup_ddp(model, args):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank = env_int("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", default=0)
    world = env_int("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", default=1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ddp = DistributedDataParallel(model)
    optimizer = make_optimizer(args, ddp.parameters(), 1)

    def average(value):
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return t.item() / world

    average.align = dist.barrier

    def finish():
        dist.barrier()
        dist.destroy_process_group()
        # torch 2.13's gloo sometimes aborts in a static destructor at exit
        # ("terminate called without an active exception", no Python frame
        # left), about one run in ten here. Everything is done and printed:
        # leave without running those destructors.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    return ddp, optimizer, rank, world, average, finish


def commlib_optimizer(model, args, mode):
    """The optimizer of one ``--mode`` for ``model`` (commlib initialised)."""
    import commlib.torch as hvd

    optimizer = make_optimizer(args, model.parameters(), hvd.size())
    if mode == "zero3":
        for layer in model:
            if isinstance(layer, nn.Linear):
                hvd.fully_shard(layer)  # (the root has no parameters of its own)
        return make_optimizer(args, model.parameters(), hvd.size())
    if mode in ("local-sgd", "diloco", "local-sgd-stream", "diloco-stream"):
        outer = (torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
                 if mode.startswith("diloco") else None)
        return hvd.LocalSGD(optimizer, model, period=args.period, outer_optimizer=outer,
                            streaming=mode.endswith("-stream"))
    if mode == "local":
        return optimizer
    if mode not in ("sync", "staleness1", "zero1", "zero2"):
        raise SystemExit(f"unknown --mode {mode!r}")
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, groups=args.groups or None,
                                         staleness=1 if mode == "staleness1" else 0,
                                         zero_stage=int(mode[4]) if mode.startswith("zero") else 0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return optimizer


def setup_commlib(model, args, mode="sync"):
    import commlib.torch as hvd

    hvd.init()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = commlib_optimizer(model, args, mode)

    def average(value):
        return hvd.allreduce(torch.tensor([value], dtype=torch.float64)).item()

    average.align = hvd.barrier

    return model, optimizer, hvd.rank(), hvd.size(), average, lambda: None


def measure(steps, args, log, align=lambda: None):
    """Samples/s per rank of each named step function; with several, they
    take turns within every iteration (same run, same load). ``align`` (not
    timed) lines the ranks up before each turn, so that a mode does not pay
    for the drift between ranks that the turn before it left (a mode without
    communication lets the ranks drift apart)."""
    for step in steps.values():
        timeit.timeit(step, number=args.num_warmup_batches)
    rates = {name: [] for name in steps}
    cpu = {name: 0.0 for name in steps}
    for i in range(args.num_iters):
        for name, step in steps.items():
            align()
            cpu_start = time.process_time()
            t = timeit.timeit(step, number=args.num_batches_per_iter)
            cpu[name] += time.process_time() - cpu_start
            rates[name].append(args.batch_size * args.num_batches_per_iter / t)
        log(f"Iter #{i}: " + ", ".join(f"{name} {r[-1]:.1f}" for name, r in rates.items())
            + " samples/s per rank")
    steps_run = args.num_iters * args.num_batches_per_iter
    return rates, {name: 1e3 * c / steps_run for name, c in cpu.items()}


def main():
    args = parse_args()
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(0)
    model = make_model(args.model)
    modes = args.mode.split(",")
    if args.backend == "ddp":
        model, optimizer, rank, world, average, finish = setup_ddp(model, args)
        models, optimizers = {"ddp": model}, {"ddp": optimizer}
    else:
        pristine = copy.deepcopy(model)  # (ZeRO and fully_shard change the model they wrap)
        model, optimizer, rank, world, average, finish = setup_commlib(model, args, modes[0])
        models, optimizers = {modes[0]: model}, {modes[0]: optimizer}
        for mode in modes[1:]:
            models[mode] = copy.deepcopy(pristine)
            optimizers[mode] = commlib_optimizer(models[mode], args, mode)

    in_features = model.module[0].in_features if hasattr(model, "module") else model[0].in_features
    out_features = (model.module if hasattr(model, "module") else model)[-1].out_features
    data = torch.randn(args.batch_size, in_features)
    target = torch.randint(0, out_features, (args.batch_size,))

    def step_of(model, optimizer):
        def benchmark_step():
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
        return benchmark_step

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    params = sum(p.numel() for p in model.parameters())
    log(f"Model: {args.model} ({params / 1e6:.1f}M parameters), backend: {args.backend}, "
        f"batch size: {args.batch_size} per rank, ranks: {world}, threads per rank: "
        f"{args.num_threads}")
    rates, cpu_ms = measure({name: step_of(models[name], optimizers[name]) for name in models},
                            args, log, align=average.align if len(models) > 1 else (lambda: None))
    for name, r in rates.items():
        mean, conf = float(np.mean(r)), 1.96 * float(np.std(r))
        mean_all = average(mean)
        prefix = f"[{name}] " if len(rates) > 1 else ""
        log(f"{prefix}Samples/s per rank: {mean_all:.1f} +-{conf:.1f}")
        log(f"{prefix}Total samples/s on {world} rank(s): {world * mean_all:.1f} "
            f"+-{world * conf:.1f}")
        # (every thread of the rank's process: training, commlib's background thread, MPI's)
        log(f"{prefix}CPU per step: {average(cpu_ms[name]):.1f} ms per rank, "
            f"wall {1e3 * args.batch_size / mean_all:.1f} ms")
    for opt in optimizers.values():
        if hasattr(opt, "pending") and opt.pending:
            opt.synchronize()
    if args.backend == "commlib":
        import commlib.torch as hvd

        for name in models:
            mib = {k: round(v / 2**20, 1)
                   for k, v in hvd.memory_report(models[name], optimizers[name]).items()}
            print(f"rank {rank} memory (MiB, {name}): {mib}", flush=True)
    finish()


if __name__ == "__main__":
    main()

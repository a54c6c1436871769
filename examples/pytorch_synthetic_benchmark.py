"""Synthetic training throughput: commlib.torch versus torch DDP.

Trains a model on random data (no input pipeline) and prints samples/s, in
the style of Horovod's pytorch_synthetic_benchmark.py, and the first step's
time on its own line. ``--device cuda`` (the default where CUDA is available)
puts each rank on GPU ``local rank % device count``; DDP then runs on NCCL,
otherwise on gloo. Models (synthetic_models.py): ``resnet50`` (the CUDA
default when torchvision is installed), ``resnet18``, ``transformer`` (a
12-layer encoder of width 512 from torch.nn; the CUDA default without
torchvision), ``mlp`` (12.5M parameters, the CPU default) and ``small-mlp``.
``--amp bf16|fp16`` trains under autocast (fp16 with a GradScaler), batch 32
per rank, one torch thread per rank. ``--sync-bn`` turns the BatchNorms into
SyncBatchNorms: commlib's, and for DDP torch's (CUDA only).

    commlibrun -np 2 python examples/pytorch_synthetic_benchmark.py --backend commlib
    commlibrun -np 2 python examples/pytorch_synthetic_benchmark.py --backend ddp
    commlibrun -np 2 python examples/pytorch_synthetic_benchmark.py --compare --model resnet50
    torchrun --nproc_per_node 2 examples/pytorch_synthetic_benchmark.py --backend ddp
    python examples/pytorch_synthetic_benchmark.py --backend commlib     # 1 rank baseline

``--compare`` trains one copy of the model with each backend in the same job
(commlib and DDP initialised side by side), the two taking turns within every
iteration, and prints the ratios of their samples/s and first steps.

Asynchronous exchange (commlib): ``--mode`` sync (default), staleness1
(DistributedOptimizer(staleness=1)), local-sgd / diloco (LocalSGD with
``--period`` H; local-sgd-stream / diloco-stream: streaming meetings), local
(no communication at all: the ceiling), or several
comma-separated: then each mode gets its own copy of the model and the modes
take turns within every iteration, so they are compared in the same run
under the same load:

    commlibrun -np 2 python examples/pytorch_synthetic_benchmark.py \
        --mode sync,staleness1,local-sgd,local --period 8

``--compression powersgd:2`` (mode sync) sends the gradients as PowerSGD
rank-2 factors (commlib.torch.optim.powersgd) from the second step on; fp16 and
bf16 as casts (``--fp16-allreduce`` is ``--compression fp16``).

Sharded data parallelism: modes zero1 and zero2 (DistributedOptimizer with
zero_stage 1 or 2) and zero3 (fully_shard on every layer, a plain optimizer
over the shards); ``--zero-stage N`` is ``--mode zeroN``. Every rank prints
its memory report for each mode. ``--optimizer adam`` gives the optimizer
state that ZeRO shards (SGD without momentum has none):

    commlibrun -np 2 python examples/pytorch_synthetic_benchmark.py \
        --mode sync,zero1,zero2,zero3 --optimizer adam

With ``--backend ddp`` alone the rank and world size come from torchrun's RANK /
WORLD_SIZE, or from MPI's launcher environment (PMI_RANK/PMI_SIZE for MPICH,
OMPI_COMM_WORLD_RANK/SIZE for Open MPI) when started by commlibrun;
MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to a free port that rank 0
picks and shares over MPI (a fixed port can still be held by a job before).
"""
import argparse
import copy
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

import synthetic_models

LOCAL_SGD_MODES = ("local-sgd", "diloco", "local-sgd-stream", "diloco-stream")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["commlib", "ddp"], default="commlib")
    p.add_argument("--compare", action="store_true",
                   help="train with both backends in one job, taking turns, and print ratios")
    p.add_argument("--device", choices=["cuda", "cpu"],
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", choices=synthetic_models.MODELS, default=None,
                   help="default: resnet50 on CUDA (transformer without torchvision), mlp on CPU")
    p.add_argument("--width", type=int, default=512, help="transformer: model width")
    p.add_argument("--layers", type=int, default=12, help="transformer: encoder layers")
    p.add_argument("--seq-len", type=int, default=128, help="transformer: tokens per sample")
    p.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off",
                   help="autocast to this type (fp16 with a GradScaler)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--num-threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--fp16-allreduce", action="store_true", help="commlib: --compression fp16")
    p.add_argument("--compression", type=compression_arg, default="none",
                   help="commlib, mode sync: none, fp16, bf16 or powersgd:R (PowerSGD of rank R, "
                        "compressing from the second step on)")
    p.add_argument("--groups", type=int, default=0,
                   help="commlib: fuse gradients into this many groups (0: one per parameter)")
    p.add_argument("--mode", default="sync",
                   help="commlib: comma-separated of sync, staleness1, local-sgd, diloco, local")
    p.add_argument("--period", type=int, default=8, help="local-sgd/diloco: steps per meeting")
    p.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2, 3],
                   help="commlib: the same as --mode zero<N> (0: --mode as given)")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--sync-bn", action="store_true",
                   help="BatchNorm over every rank's batch: commlib.torch.SyncBatchNorm, and for "
                        "DDP torch.nn.SyncBatchNorm (which needs CUDA)")
    args = p.parse_args()
    if args.sync_bn and args.device == "cpu" and (args.compare or args.backend == "ddp"):
        p.error("--sync-bn with DDP needs --device cuda (torch.nn.SyncBatchNorm runs on GPUs)")
    if args.fp16_allreduce:
        args.compression = "fp16"
    if args.compression.startswith("powersgd") and args.mode != "sync":
        p.error("--compression powersgd:R works with --mode sync only")
    if args.zero_stage:
        args.mode = f"zero{args.zero_stage}"
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available (use --device cpu)")
    if args.model is None:
        args.model = "mlp" if args.device == "cpu" else (
            "resnet50" if _has_torchvision() else "transformer")
    if args.amp == "fp16" and any(m in LOCAL_SGD_MODES for m in args.mode.split(",")):
        p.error("--amp fp16 (a GradScaler) works with the modes sync, staleness1, zero1, "
                "zero2, zero3 and local")
    return args


def compression_arg(text):
    """--compression's value: none, fp16, bf16 or powersgd:R (R >= 1)."""
    kind, colon, rank = text.partition(":")
    if kind in ("none", "fp16", "bf16") and not colon:
        return text
    if kind == "powersgd" and rank.isdigit() and int(rank) >= 1:
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: none, fp16, bf16 or powersgd:R (R >= 1)")


def _has_torchvision():
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True


def env_int(*names, default=None):
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return default


def make_optimizer(args, params, scale):
    if args.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-4 * scale)
    return torch.optim.SGD(params, lr=0.01 * scale, momentum=0.9 if args.device == "cuda" else 0)


def free_port_of_rank_0():
    """A TCP port free on rank 0's host, the same on every rank (MPI)."""
    import socket

    from mpi4py import MPI

    port = None
    if MPI.COMM_WORLD.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
    return MPI.COMM_WORLD.bcast(port, root=0)


def setup_ddp(model, args, device, rank, world):
    """DDP over NCCL (CUDA) or gloo (CPU): the model and its optimizer."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(free_port_of_rank_0())
    if device.type == "cuda":
        dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
        ddp = DistributedDataParallel(model, device_ids=[device.index])
    else:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        ddp = DistributedDataParallel(model)
    return ddp, make_optimizer(args, ddp.parameters(), 1)


def commlib_optimizer(model, args, mode):
    """The optimizer of one ``--mode`` for ``model`` (commlib initialised)."""
    import commlib.torch as hvd

    optimizer = make_optimizer(args, model.parameters(), hvd.size())
    if mode == "zero3":
        for layer in model.children():
            if any(True for _ in layer.parameters()):
                hvd.fully_shard(layer)  # (the root has no parameters of its own)
        return make_optimizer(args, model.parameters(), hvd.size())
    if mode in LOCAL_SGD_MODES:
        outer = (torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
                 if mode.startswith("diloco") else None)
        return hvd.LocalSGD(optimizer, model, period=args.period, outer_optimizer=outer,
                            streaming=mode.endswith("-stream"))
    if mode == "local":
        return optimizer
    if mode not in ("sync", "staleness1", "zero1", "zero2"):
        raise SystemExit(f"unknown --mode {mode!r}")
    kind, _, rank = args.compression.partition(":")
    compression = (hvd.Compression.powersgd(rank=int(rank), start_step=1) if kind == "powersgd"
                   else getattr(hvd.Compression, kind))
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, groups=args.groups or None,
                                         staleness=1 if mode == "staleness1" else 0,
                                         zero_stage=int(mode[4]) if mode.startswith("zero") else 0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return optimizer


def setup_commlib(model, args, mode):
    import commlib.torch as hvd

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model, commlib_optimizer(model, args, mode)


def broadcast_times(model, device, align, rounds=3):
    """Median seconds to broadcast ``model``'s state_dict from rank 0 (after
    a warm-up round): commlib's broadcast_parameters (fused into few
    collectives) and a loop of torch.distributed.broadcast, one call per
    tensor; each timed call follows an untimed barrier."""
    import torch.distributed as dist

    import commlib.torch as hvd

    state = model.state_dict()

    def wait():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def ours():
        hvd.broadcast_parameters(state, root_rank=0)
        wait()

    def theirs():
        for t in state.values():
            dist.broadcast(t, src=0)
        wait()

    times = ([], [])
    for i in range(rounds + 1):
        for fn, out in zip((ours, theirs), times):
            align()
            start = time.perf_counter()
            fn()
            if i:
                out.append(time.perf_counter() - start)
    return float(np.median(times[0])), float(np.median(times[1])), len(state), \
        sum(t.numel() * t.element_size() for t in state.values())


def step_of(model, optimizer, data, target, args, device):
    """One training step (forward, backward, optimizer step) under --amp."""
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.amp.GradScaler(device.type) if args.amp == "fp16" else None

    def benchmark_step():
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = F.cross_entropy(model(data), target)
        if scaler is None:
            loss.backward()
            optimizer.step()
            return
        scaler.scale(loss).backward()
        if hasattr(optimizer, "skip_synchronize"):  # commlib: unscale the averaged gradients
            optimizer.synchronize()
            scaler.unscale_(optimizer)
            with optimizer.skip_synchronize():
                scaler.step(optimizer)
        else:
            scaler.step(optimizer)
        scaler.update()
    return benchmark_step


def timed(step, number, device):
    """Seconds for ``number`` steps, the device's work included."""
    start = time.perf_counter()
    for _ in range(number):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def measure(steps, args, device, log, align=lambda: None):
    """Samples/s per rank of each named step function; with several, they
    take turns within every iteration (same run, same load). ``align`` (not
    timed) lines the ranks up before each turn, so that a mode does not pay
    for the drift between ranks that the turn before it left (a mode without
    communication lets the ranks drift apart)."""
    for step in steps.values():
        align()
        timed(step, args.num_warmup_batches, device)
    rates = {name: [] for name in steps}
    cpu = {name: 0.0 for name in steps}
    for i in range(args.num_iters):
        for name, step in steps.items():
            align()
            cpu_start = time.process_time()
            t = timed(step, args.num_batches_per_iter, device)
            cpu[name] += time.process_time() - cpu_start
            rates[name].append(args.batch_size * args.num_batches_per_iter / t)
        log(f"Iter #{i}: " + ", ".join(f"{name} {r[-1]:.1f}" for name, r in rates.items())
            + " samples/s per rank")
    steps_run = args.num_iters * args.num_batches_per_iter
    return rates, {name: 1e3 * c / steps_run for name, c in cpu.items()}


def main():
    args = parse_args()
    torch.set_num_threads(args.num_threads)
    use_commlib = args.compare or args.backend == "commlib"
    use_ddp = args.compare or args.backend == "ddp"
    if use_commlib:
        import commlib.torch as hvd

        hvd.init()
        rank, world, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
    else:
        rank = env_int("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", default=0)
        world = env_int("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", default=1)
        local_rank = env_int("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                             default=0)
    if args.device == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)
    pristine, data, target = synthetic_models.make(args.model, device, args.batch_size,
                                                   args.width, args.layers, args.seq_len)
    if args.sync_bn and not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                                for m in pristine.modules()):
        raise SystemExit(f"--sync-bn: --model {args.model} has no BatchNorm layer")

    def copy_for(backend):
        """A copy of the model for ``backend``, its BatchNorms synchronised under --sync-bn."""
        model = copy.deepcopy(pristine)
        if not args.sync_bn:
            return model
        if backend == "ddp":
            return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return hvd.SyncBatchNorm.convert_sync_batchnorm(model)

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    models, optimizers, setup_s = {}, {}, {}
    modes = args.mode.split(",")
    names = ["commlib" if args.compare and modes == ["sync"] else m for m in modes]
    if use_ddp:
        start = time.perf_counter()
        models["ddp"], optimizers["ddp"] = setup_ddp(copy_for("ddp"), args, device, rank, world)
        setup_s["ddp"] = time.perf_counter() - start
    if use_commlib:
        for name, mode in zip(names, modes):
            start = time.perf_counter()
            models[name], optimizers[name] = setup_commlib(copy_for("commlib"), args, mode)
            setup_s[name] = time.perf_counter() - start
    if use_commlib:
        def average(value):
            return hvd.allreduce(torch.tensor([value], dtype=torch.float64)).item()
        align = hvd.barrier
    else:
        import torch.distributed as dist

        def average(value):
            t = torch.tensor([value], dtype=torch.float64,
                             device=device if device.type == "cuda" else "cpu")
            dist.all_reduce(t)
            return t.item() / world
        align = dist.barrier

    steps = {name: step_of(models[name], optimizers[name], data, target, args, device)
             for name in models}
    params = sum(p.numel() for p in pristine.parameters())
    log(f"Model: {args.model} ({params / 1e6:.1f}M parameters), backend: "
        f"{'commlib and ddp' if args.compare else args.backend}, device: {args.device}, "
        f"amp: {args.amp}, compression: {args.compression}, sync-bn: {'on' if args.sync_bn else 'off'}, "
        f"batch size: {args.batch_size} per rank, ranks: {world}, "
        f"threads per rank: {args.num_threads}")
    first = {}
    for name, step in steps.items():
        align()
        first[name] = average(timed(step, 1, device))
        log(f"First step [{name}]: {first[name]:.3f} s (setup before it "
            f"{average(setup_s[name]):.3f} s)")
    if args.compare:  # (DDP's rendezvous is up: torch.distributed's broadcast to compare with)
        ours, theirs, count, nbytes = broadcast_times(models[names[0]], device, align)
        ours, theirs = average(ours), average(theirs)
        log(f"Broadcast of the model's {count} tensors ({nbytes / 1e6:.1f} MB) from rank 0: "
            f"commlib broadcast_parameters {1e3 * ours:.1f} ms, a loop of "
            f"torch.distributed.broadcast {1e3 * theirs:.1f} ms ({theirs / ours:.2f}x)")
    rates, cpu_ms = measure(steps, args, device, log,
                            align=align if len(steps) > 1 else (lambda: None))
    means = {}
    for name, r in rates.items():
        mean, conf = float(np.mean(r)), 1.96 * float(np.std(r))
        means[name] = mean_all = average(mean)
        prefix = f"[{name}] " if len(rates) > 1 else ""
        log(f"{prefix}Samples/s per rank: {mean_all:.1f} +-{conf:.1f}")
        log(f"{prefix}Total samples/s on {world} rank(s): {world * mean_all:.1f} "
            f"+-{world * conf:.1f}")
        # (every thread of the rank's process: training, commlib's background thread, MPI's)
        log(f"{prefix}CPU per step: {average(cpu_ms[name]):.1f} ms per rank, "
            f"wall {1e3 * args.batch_size / mean_all:.1f} ms")
    if args.compare:
        for name in names:
            log(f"Ratio {name}/ddp: samples/s {means[name] / means['ddp']:.2f}x, "
                f"first step {first[name] / first['ddp']:.2f}x the time")
    for opt in optimizers.values():
        if hasattr(opt, "pending") and opt.pending:
            opt.synchronize()
    if use_commlib:
        for name in names:
            mib = {k: round(v / 2**20, 1)
                   for k, v in hvd.memory_report(models[name], optimizers[name]).items()}
            print(f"rank {rank} memory (MiB, {name}): {mib}", flush=True)
    if use_ddp:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
        if use_commlib:
            # Both jobs' ends in order, MPI's last: then the interpreter
            # exits as usual. (An os._exit right after MPI_Finalize loses a
            # race with MPICH's launcher on a loaded machine: it takes the
            # rank for a crash and kills the others.)
            from mpi4py import MPI

            hvd.shutdown()
            MPI.Finalize()


if __name__ == "__main__":
    main()

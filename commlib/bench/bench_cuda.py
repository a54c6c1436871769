"""``python -m commlib.bench --device cuda``: collectives on CUDA buffers,
commlib (NCCL in the core, through commlib.device_ops) against
torch.distributed's NCCL backend, measured in the same run and interleaved,
and a ping-pong of ``sendrecv`` between ranks 0 and 1 (commlib.device_p2p
against torch.distributed's send/recv), plus commlib's host-staging path for
allreduce (copy to pinned host memory, the CPU path, copy back) against the
CPU path on the same data plus the two copies measured alone.

torch serves only as the CUDA allocator and the reference; commlib.torch is
not imported (commlib/ imports no frontend). Each commlib call is submitted
and synchronized (the handle completes when NCCL finished on the device);
each torch call is followed by torch.cuda.synchronize(). Allgather and
alltoall are given their output sizes directly (commlib.torch first learns
them with a small host allgather, not timed here). When the ranks of a host
outnumber its GPUs, every rank gets its own NCCL_HOSTID (the set-up of
../shared/GPU.md, for correctness runs; such speeds are loopback-socket speeds).
"""
from __future__ import annotations

import os

import numpy as np

CUDA_OPS = ("allreduce", "allgather", "broadcast", "reducescatter", "alltoall", "sendrecv")


def _ping_pong(me: int, send, recv, sync):
    """Rank 0 sends then receives, rank 1 receives then sends (others idle);
    then the device is synchronized."""
    if me == 0:
        send()
        recv()
    elif me == 1:
        recv()
        send()
    sync()


def unavailable_reason() -> str:
    """Why CUDA collectives through NCCL cannot run here, with torch ("" when
    they can; also the reason tests/gpu gives for skipping)."""
    try:
        import torch
    except ImportError:
        return "needs torch built with CUDA (torch is not installed)"
    if not torch.cuda.is_available():
        return f"needs a CUDA device, and torch {torch.__version__} sees none"
    from .. import gpu
    status = gpu.load()
    if not status.nccl.usable:
        return f"needs NCCL: {status.nccl.error} (pip install nvidia-nccl-cu13)"
    if not status.cuda.usable:
        return f"needs the CUDA runtime: {status.cuda.error}"
    return ""


def _share_gpu_if_needed(rank: int, local_size: int, torch) -> None:
    if local_size > torch.cuda.device_count() and "NCCL_HOSTID" not in os.environ:
        os.environ["NCCL_HOSTID"] = f"commlibbench{rank}"
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


class CommlibCuda:
    name = "commlib"

    def __init__(self, commlib, torch, n):
        from .. import device_ops
        from ..dtypes import dtype_code
        self.c, self.torch, self.n, self.ops, self.code = commlib, torch, n, device_ops, dtype_code

    def make(self, op, count, tdtype, dev):
        torch, n = self.torch, self.n
        code = self.code(np.dtype(str(tdtype).replace("torch.", "")))
        if op == "sendrecv":  # (the core's NCCL links, as commlib.torch's send/recv use them)
            return self._ping_pong(count, code, tdtype, dev)
        per = max(1, count // n)
        x = torch.ones(count if op in ("allreduce", "broadcast") else per * (1 if op == "allgather" else n),
                       dtype=tdtype, device=dev)
        out_rows = {"allreduce": count, "broadcast": count, "allgather": per * n, "alltoall": per * n,
                    "reducescatter": per}[op]
        out = torch.empty(out_rows, dtype=tdtype, device=dev)
        kind = self.ops.OPS[op]
        buf = self.ops.DeviceBuffer(x.data_ptr(), code, tuple(x.shape))
        stream = torch.cuda.current_stream(dev).cuda_stream
        name = f"bench.cuda.{op}.{count}"
        extra = {"output_rows": out_rows} if op in ("allgather", "alltoall") else {}
        return lambda: self.c.synchronize(self.ops.submit(kind, name, buf, out.data_ptr(), device=dev.index,
                                                          stream=stream, reduce_op=self.c.Sum, **extra))

    def _ping_pong(self, count, code, tdtype, dev):
        from .. import device_p2p
        torch, me = self.torch, self.c.rank()
        x, out = torch.ones(count, dtype=tdtype, device=dev), torch.empty(count, dtype=tdtype, device=dev)
        stream = torch.cuda.current_stream(dev).cuda_stream
        on = {"device": dev.index, "stream": stream}

        def send():
            self.c.synchronize(device_p2p.isend_device(x.data_ptr(), code, (count,), 1 - me, 7, **on))

        def recv():  # (into memory of the message's size, as commlib.torch's recv(out=...))
            self.c.synchronize(device_p2p.irecv_device(1 - me, 7, device_out=out.data_ptr(), dtype=code,
                                                       shape=(count,), **on))
        return lambda: _ping_pong(me, send, recv, lambda: torch.cuda.synchronize(dev))


class TorchNccl:
    name = "torch-nccl"

    def __init__(self, torch, n):
        self.torch, self.dist, self.n = torch, torch.distributed, n

    def make(self, op, count, tdtype, dev):
        torch, dist, n = self.torch, self.dist, self.n
        per = max(1, count // n)
        if op == "sendrecv":
            x, out, me = torch.ones(count, dtype=tdtype, device=dev), torch.empty(count, dtype=tdtype, device=dev), \
                dist.get_rank()
            return lambda: _ping_pong(me, lambda: dist.send(x, 1 - me), lambda: dist.recv(out, 1 - me),
                                      lambda: torch.cuda.synchronize(dev))
        if op in ("allreduce", "broadcast"):
            x = torch.ones(count, dtype=tdtype, device=dev)
            call = (lambda: dist.all_reduce(x)) if op == "allreduce" else (lambda: dist.broadcast(x, src=0))
        elif op == "allgather":
            x, out = torch.ones(per, dtype=tdtype, device=dev), torch.empty(per * n, dtype=tdtype, device=dev)
            call = lambda: dist.all_gather_into_tensor(out, x)  # noqa: E731
        elif op == "reducescatter":
            x, out = torch.ones(per * n, dtype=tdtype, device=dev), torch.empty(per, dtype=tdtype, device=dev)
            call = lambda: dist.reduce_scatter_tensor(out, x)  # noqa: E731
        else:
            x = torch.ones(per * n, dtype=tdtype, device=dev)
            out = torch.empty_like(x)
            call = lambda: dist.all_to_all_single(out, x)  # noqa: E731

        def run():
            call()
            torch.cuda.synchronize(dev)
        return run


def staging_case(commlib, torch, count, dev, iters, comm, time_calls):
    """Median seconds: (host-staged allreduce, CPU allreduce, the two copies alone)."""
    x = torch.ones(count, device=dev)
    host = torch.empty(count, pin_memory=True)
    arr = host.numpy()

    def copies():
        host.copy_(x)
        x.copy_(host)
        torch.cuda.synchronize(dev)

    def staged():
        host.copy_(x)
        commlib.allreduce_(arr, op=commlib.Sum, name="bench.staged")
        x.copy_(host)
        torch.cuda.synchronize(dev)

    def cpu():
        commlib.allreduce_(arr, op=commlib.Sum, name="bench.cpu")

    import statistics
    from mpi4py import MPI
    out = []
    for fn in (staged, cpu, copies):
        fn()
        out.append(comm.allreduce(statistics.median(time_calls(fn, iters, comm)), op=MPI.MAX))
    return tuple(out)


def _measure(impls, op, count, tdtype, dev, iters, warmup, comm, time_calls):
    """Median seconds per call of each implementation (slowest rank's), interleaved in 3 rounds."""
    import statistics
    from mpi4py import MPI

    fns = {impl.name: impl.make(op, count, tdtype, dev) for impl in impls}
    samples = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    for _ in range(3):
        for name, fn in fns.items():
            samples[name] += time_calls(fn, max(1, iters // 3), comm)
    return {name: comm.allreduce(statistics.median(ts), op=MPI.MAX) for name, ts in samples.items()}


def main(args, ops, byte_sizes, dtype_name, tools) -> int:
    """The --device cuda run (after unavailable_reason() said it can). tools:
    commlib.bench's time_calls, bus_factor, human and init_gloo (passed in:
    commlib.bench imports this module)."""
    import torch
    from mpi4py import MPI

    import commlib
    time_calls, bus_factor, human, init_gloo = tools
    comm = MPI.COMM_WORLD
    _share_gpu_if_needed(comm.Get_rank(), comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size(), torch)
    commlib.init()
    n, me = commlib.size(), commlib.rank()
    dev = torch.device("cuda", commlib.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    tdtype = getattr(torch, dtype_name)
    esize = torch.tensor([], dtype=tdtype).element_size()
    init_gloo(comm, backend="nccl")
    impls = [CommlibCuda(commlib, torch, n), TorchNccl(torch, n)]
    say = (lambda *a: print(*a, flush=True)) if me == 0 else (lambda *a: None)
    say(f"# commlib.bench --device cuda: {n} ranks on {torch.cuda.get_device_name(dev)}, dtype {dtype_name}; "
        "times are medians in us (slowest rank)" + ("; ranks aligned before every call" if args.aligned else "")
        + "; ratio = torch-nccl time / commlib time (> 1: commlib faster)")
    for op in [o for o in ops if o in CUDA_OPS and (o != "sendrecv" or n > 1)]:
        say(f"\n{'op':<14}{'size':>10} {'commlib us':>11} {'busbw':>7} {'torch us':>11} {'busbw':>7} {'ratio':>6}")
        for nbytes in byte_sizes:
            count = max(n, nbytes // esize)
            iters = max(5, min(args.iters, (1 << 30) // max(nbytes, 1)))
            t = _measure(impls, op, count, tdtype, dev, iters, args.warmup, comm, time_calls)
            bw = [nbytes / t[i.name] / 1e9 * bus_factor(op, n) for i in impls]
            say(f"{op:<14}{human(nbytes):>10} {t['commlib'] * 1e6:11.1f} {bw[0]:7.2f} "
                f"{t['torch-nccl'] * 1e6:11.1f} {bw[1]:7.2f} {t['torch-nccl'] / t['commlib']:6.2f}")
    if "allreduce" in ops:
        count = max(n, byte_sizes[-1] // 4)
        staged, cpu, copies = staging_case(commlib, torch, count, dev, 10, comm, time_calls)
        say(f"\nhost staging, {human(count * 4)} float32 allreduce: staged {staged * 1e3:.2f} ms; CPU path "
            f"{cpu * 1e3:.2f} ms + the two copies {copies * 1e3:.2f} ms = {(cpu + copies) * 1e3:.2f} ms "
            f"(staged / that: {staged / (cpu + copies):.2f})")
    torch.distributed.destroy_process_group()
    commlib.shutdown()
    return 0

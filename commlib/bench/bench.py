"""Collective benchmarks in the style of nccl-tests, against raw MPI and gloo.

    commlibrun -np 2 python -m commlib.bench                # all ops, 4 B .. 256 MiB
    commlibrun -np 2 python -m commlib.bench --ops allreduce --max-bytes 64M --plot bw.png

For each operation and size it prints commlib's median time, algorithm
bandwidth and bus bandwidth, the same for raw MPI through mpi4py and (when
torch is installed) torch.distributed's gloo backend, measured in the same run
and interleaved so that the machine's drift affects all alike, and the ratios
(>1 means commlib is faster). ``sendrecv`` is a ping-pong between ranks 0
and 1 (blocking send then receive into a preallocated buffer, and the
mirror image; the other ranks idle): its time is the round trip and its bus
bandwidth the bytes moved one way per second. The ``fusion`` case submits 128 tensors of
4 KiB asynchronously and synchronizes them, against 128 sequential
MPI_Allreduce calls; the gather fusion case does the same with allgathers
and reducescatters (against MPI_Allgather, MPI_Reduce_scatter_block). The
small calls (commlib.bench.small_calls) time one 4 KiB blocking call of each
collective through commlib.torch against mpi4py's.

Sizes follow nccl-tests: allreduce/broadcast/alltoall move ``size`` bytes per
rank; allgather produces ``size`` bytes (each rank contributes size/n);
reducescatter reduces ``size`` bytes into size/n per rank. Bus bandwidth
scales algorithm bandwidth by the share of data each link must carry
(2(n-1)/n for allreduce, (n-1)/n for allgather/reducescatter/alltoall, 1 for
broadcast), so that it is comparable across rank counts.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys

import numpy as np

from . import small_calls
from .timing import interleaved_medians, time_calls

OPS = ("allreduce", "allgather", "broadcast", "reducescatter", "alltoall", "sendrecv")
DTYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16,
          "int32": np.int32, "int64": np.int64, "uint8": np.uint8}


def parse_size(text: str) -> int:
    """'4', '64K', '1M', '256M', '1G' -> bytes."""
    text = text.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def human(nbytes: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:g} {unit}"
    return f"{nbytes} B"


def bus_factor(op: str, n: int) -> float:
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op == "broadcast":
        return 1.0
    if op == "sendrecv":
        return 2.0  # a round trip moves the bytes twice
    return (n - 1) / n


def ping_pong(me: int, send, recv):
    """Rank 0 sends then receives, rank 1 receives then sends; others idle."""
    if me == 0:
        return lambda: (send(1), recv(1))
    if me == 1:
        return lambda: (recv(0), send(0))
    return lambda: None


def sizes(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


class Impl:
    """One implementation: builds a callable per (op, size)."""

    name = ""

    def make(self, op: str, nbytes: int, dtype):  # -> callable or None
        raise NotImplementedError


class CommlibImpl(Impl):
    name = "commlib"

    def __init__(self, commlib, n):
        self.c, self.n = commlib, n

    def make(self, op, nbytes, dtype):
        c, n, esize = self.c, self.n, np.dtype(dtype).itemsize
        count = max(1, nbytes // esize)
        # One name per case, as a training step names its tensors: repeated
        # calls then skip the coordinator (the response cache).
        name = f"bench.{op}.{nbytes}"
        if op == "allreduce":
            x = np.ones(count, dtype)
            return lambda: c.allreduce_(x, op=c.Sum, name=name)
        if op == "broadcast":
            x = np.ones(count, dtype)
            return lambda: c.broadcast_(x, root_rank=0, name=name)
        if op == "allgather":
            x = np.ones(max(1, count // n), dtype)
            return lambda: c.allgather(x, name=name)
        if op == "reducescatter":
            x = np.ones(max(n, count // n * n), dtype)
            return lambda: c.reducescatter(x, op=c.Sum, name=name)
        if op == "alltoall":
            x = np.ones(max(n, count // n * n), dtype)
            return lambda: c.alltoall(x, name=name)
        if op == "sendrecv":
            x, y = np.ones(count, dtype), np.empty(count, dtype)
            return ping_pong(c.rank(), lambda p: c.send(x, p), lambda p: c.recv(p, out=y))
        return None


class MpiImpl(Impl):
    name = "mpi"

    def __init__(self, comm):
        from mpi4py import MPI

        self.MPI, self.comm, self.n = MPI, comm, comm.Get_size()

    def make(self, op, nbytes, dtype):
        MPI, comm, n, esize = self.MPI, self.comm, self.n, np.dtype(dtype).itemsize
        count = max(1, nbytes // esize)
        if op == "allreduce":
            x = np.ones(count, dtype)
            return lambda: comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        if op == "broadcast":
            x = np.ones(count, dtype)
            return lambda: comm.Bcast(x, root=0)
        if op == "allgather":
            x = np.ones(max(1, count // n), dtype)
            out = np.empty(x.size * n, dtype)
            return lambda: comm.Allgather(x, out)
        if op == "reducescatter":
            x = np.ones(max(n, count // n * n), dtype)
            out = np.empty(x.size // n, dtype)
            return lambda: comm.Reduce_scatter_block(x, out, op=MPI.SUM)
        if op == "alltoall":
            x = np.ones(max(n, count // n * n), dtype)
            out = np.empty_like(x)
            return lambda: comm.Alltoall(x, out)
        if op == "sendrecv":
            x, y = np.ones(count, dtype), np.empty(count, dtype)
            return ping_pong(comm.Get_rank(), lambda p: comm.Send(x, p), lambda p: comm.Recv(y, p))
        return None


class GlooImpl(Impl):
    name = "gloo"

    def __init__(self, torch, n):
        self.torch, self.dist, self.n = torch, torch.distributed, n

    def make(self, op, nbytes, dtype):
        torch, dist, n = self.torch, self.dist, self.n
        tdtype = getattr(torch, np.dtype(dtype).name)
        count = max(1, nbytes // np.dtype(dtype).itemsize)
        if op == "allreduce":
            x = torch.ones(count, dtype=tdtype)
            fn = lambda: dist.all_reduce(x)  # noqa: E731
        elif op == "broadcast":
            x = torch.ones(count, dtype=tdtype)
            fn = lambda: dist.broadcast(x, src=0)  # noqa: E731
        elif op == "allgather":
            x = torch.ones(max(1, count // n), dtype=tdtype)
            out = torch.empty(x.numel() * n, dtype=tdtype)
            fn = lambda: dist.all_gather_into_tensor(out, x)  # noqa: E731
        elif op == "reducescatter":
            x = torch.ones(max(n, count // n * n), dtype=tdtype)
            out = torch.empty(x.numel() // n, dtype=tdtype)
            fn = lambda: dist.reduce_scatter_tensor(out, x)  # noqa: E731
        elif op == "alltoall":
            x = torch.ones(max(n, count // n * n), dtype=tdtype)
            out = torch.empty_like(x)
            fn = lambda: dist.all_to_all_single(out, x)  # noqa: E731
        elif op == "sendrecv":
            x, y = torch.ones(count, dtype=tdtype), torch.empty(count, dtype=tdtype)
            fn = ping_pong(dist.get_rank(), lambda p: dist.send(x, p), lambda p: dist.recv(y, p))
        else:
            return None
        try:  # gloo lacks some collectives; probe once, on every rank
            fn()
        except (RuntimeError, NotImplementedError, ValueError):
            return None
        return fn


def init_gloo(comm, backend="gloo"):
    """torch.distributed over gloo (or ``backend``), rendezvous address shared through MPI."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None
    import socket

    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=comm.Get_rank(), world_size=comm.Get_size())
    return torch


def measure(impls, op, nbytes, dtype, iters, warmup, rounds, comm):
    """Median seconds per call for each implementation (slowest rank's)."""
    from mpi4py import MPI

    fns = {impl.name: impl.make(op, nbytes, dtype) for impl in impls}
    samples = {name: [] for name, fn in fns.items() if fn is not None}
    for name in samples:
        for _ in range(warmup):
            fns[name]()
    for _ in range(rounds):  # interleave implementations against drift
        for name in samples:
            samples[name] += time_calls(fns[name], max(1, iters // rounds), comm)
    result = {}
    for name, ts in samples.items():
        med = statistics.median(ts)
        result[name] = comm.allreduce(med, op=MPI.MAX)
    return result


def fusion_case(commlib, comm, count: int = 128, nbytes: int = 4096, iters: int = 50):
    """count tensors of nbytes submitted asynchronously and synchronized, as
    one grouped call (in place, and out of place) and as count separate
    async calls, vs sequential MPI_Allreduce calls. Returns the four median
    times."""
    from mpi4py import MPI

    xs = [np.ones(nbytes // 4, np.float32) for _ in range(count)]

    def fused():
        commlib.synchronize(commlib.grouped_allreduce_async_(xs, op=commlib.Sum, name="fusion"))

    def fused_out_of_place():
        commlib.grouped_allreduce(xs, op=commlib.Sum, name="fusion.oop")

    def one_by_one():
        hs = [commlib.allreduce_async_(x, op=commlib.Sum, name=f"fusion.{i}") for i, x in enumerate(xs)]
        for h in hs:
            commlib.synchronize(h)

    def sequential():
        for x in xs:
            comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)

    cases = (fused, fused_out_of_place, one_by_one, sequential)
    return interleaved_medians(cases, iters, comm)


def torch_fusion_case(comm, count: int = 128, nbytes: int = 4096, iters: int = 60):
    """commlib.torch's submission route: count float32 tensors of nbytes as
    count ``allreduce_async_`` + ``synchronize``, and as one
    ``grouped_allreduce``, vs count sequential MPI_Allreduce calls (mpi4py).
    Returns the three median times; None without torch."""
    import importlib

    try:
        import torch
    except ImportError:
        return None
    ct = importlib.import_module("commlib.torch")  # (by name: commlib/ imports no frontend)
    from mpi4py import MPI

    ts = [torch.ones(nbytes // 4) for _ in range(count)]
    xs = [np.ones(nbytes // 4, np.float32) for _ in range(count)]
    names = [f"tfusion.{i}" for i in range(count)]

    def separate():
        hs = [ct.allreduce_async_(t, name=nm, op=ct.Sum) for t, nm in zip(ts, names)]
        for h in hs:
            ct.synchronize(h)

    def grouped():
        ct.grouped_allreduce(ts, name="tfusion.grouped", op=ct.Sum)

    def sequential():
        for x in xs:
            comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)

    torch.set_num_threads(1)
    return interleaved_medians((separate, grouped, sequential), iters, comm)


def gather_fusion_case(commlib, comm, count: int = 128, nbytes: int = 4096, iters: int = 30):
    """count allgathers (and count reducescatters) of nbytes per rank
    submitted asynchronously, then synchronized (the core fuses them), vs
    sequential MPI_Allgather (MPI_Reduce_scatter_block) calls. Returns the
    five median times: commlib allgathers (new results; into given outs),
    MPI's (into given outs), commlib reducescatters, MPI's."""
    from mpi4py import MPI

    n = comm.Get_size()
    xs = [np.ones(nbytes // 4, np.float32) for _ in range(count)]
    gathered = [np.empty(n * (nbytes // 4), np.float32) for _ in range(count)]
    parts = [np.empty(nbytes // 4 // n or 1, np.float32) for _ in range(count)]
    whole = [np.ones(len(p) * n, np.float32) for p in parts]

    def gathers():
        hs = [commlib.allgather_async(x, name=f"gfusion.{i}") for i, x in enumerate(xs)]
        for h in hs:
            commlib.synchronize(h)

    def gathers_into():
        hs = [commlib.allgather_async(x, name=f"gfusion.out.{i}", out=g)
              for i, (x, g) in enumerate(zip(xs, gathered))]
        for h in hs:
            commlib.synchronize(h)

    def mpi_gathers():
        for x, g in zip(xs, gathered):
            comm.Allgather(x, g)

    def scatters():
        hs = [commlib.reducescatter_async(w, op=commlib.Sum, name=f"rsfusion.{i}", out=p)
              for i, (w, p) in enumerate(zip(whole, parts))]
        for h in hs:
            commlib.synchronize(h)

    def mpi_scatters():
        for w, p in zip(whole, parts):
            comm.Reduce_scatter_block(w, p, op=MPI.SUM)

    cases = (gathers, gathers_into, mpi_gathers, scatters, mpi_scatters)
    return interleaved_medians(cases, iters, comm)


def plot(rows, path, n):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = sorted({r["op"] for r in rows}, key=OPS.index)
    fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for impl in ("commlib", "mpi", "gloo"):
            pts = [(r["bytes"], r[impl + "_busbw"]) for r in rows if r["op"] == op and r.get(impl + "_busbw")]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{op}, {n} ranks")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="commlib.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated: " + ", ".join(OPS))
    p.add_argument("--min-bytes", "-b", default="4", help="smallest size (default 4)")
    p.add_argument("--max-bytes", "-e", default="256M", help="largest size (default 256M)")
    p.add_argument("--factor", "-f", type=int, default=4, help="size multiplier (default 4)")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--iters", type=int, default=300, help="timed calls at small sizes (fewer for large)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--aligned", action="store_true",
                   help="--device cuda: ranks line up (untimed barrier) before every call: latency per call")
    p.add_argument("--algo", default=None, help="COMMLIB_ALLREDUCE_ALGO for this run (auto, shm, mpi, ...)")
    p.add_argument("--no-gloo", action="store_true", help="skip torch gloo even if torch is installed")
    p.add_argument("--no-fusion", action="store_true",
                   help="skip the 128 x 4 KiB fusion cases and the small commlib.torch calls")
    p.add_argument("--fusion-only", action="store_true",
                   help="only the 128 x 4 KiB fusion cases and the small commlib.torch calls (against MPI)")
    p.add_argument("--plot", metavar="PNG", help="draw bus bandwidth against size to this file")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: CUDA buffers, commlib's NCCL path against torch.distributed NCCL (bench_cuda)")
    args = p.parse_args(argv)

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad:
        p.error(f"unknown op(s): {', '.join(bad)}")
    if args.algo:
        os.environ["COMMLIB_ALLREDUCE_ALGO"] = args.algo
    if args.device == "cuda":
        from . import bench_cuda
        why = bench_cuda.unavailable_reason()
        if why:
            print(f"commlib.bench: --device cuda {why}", file=sys.stderr, flush=True)
            return 2
        return bench_cuda.main(args, ops, sizes(parse_size(args.min_bytes), parse_size(args.max_bytes),
                                                args.factor), args.dtype,
                               (functools.partial(time_calls, aligned=args.aligned), bus_factor, human,
                                init_gloo))
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error("--plot needs matplotlib (pip install matplotlib)")

    import commlib
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    commlib.init()
    n, me = commlib.size(), commlib.rank()
    if n < 2 and "sendrecv" in ops:
        ops.remove("sendrecv")  # (a ping-pong needs two ranks)
    impls = [CommlibImpl(commlib, n), MpiImpl(comm)]
    dtype = DTYPES[args.dtype]
    cases = [(op, nbytes) for op in ops
             for nbytes in sizes(parse_size(args.min_bytes), parse_size(args.max_bytes), args.factor)]

    def run(impl_list):
        for op, nbytes in cases:
            iters = max(5, min(args.iters, (1 << 30) // max(nbytes, 1)))
            times.setdefault((op, nbytes), {}).update(
                measure(impl_list, op, nbytes, dtype, iters, args.warmup, 3 if iters >= 6 else 1, comm))

    def say(*a):
        if me == 0:
            print(*a, flush=True)

    # commlib and MPI are measured interleaved; gloo afterwards, in the same
    # run: once torch.distributed is up, its threads compete for the cores
    # with every other library's waits (on 2 cores they halve commlib's
    # small-message speed), which would not be a fair comparison.
    times: dict = {}
    if args.fusion_only:
        cases = []
    run(impls)
    fusion = None if args.no_fusion else fusion_case(commlib, comm)
    tfusion = None if args.no_fusion else torch_fusion_case(comm)
    gfusion = None if args.no_fusion or n < 2 else gather_fusion_case(commlib, comm)
    small = None if args.no_fusion else small_calls.torch_calls_case(comm)
    names = [i.name for i in impls]
    torch = None if args.no_gloo or args.fusion_only else init_gloo(comm)
    if torch is not None:
        gloo = GlooImpl(torch, n)
        run([gloo])
        names.append(gloo.name)
        torch.distributed.destroy_process_group()

    algo = os.environ.get("COMMLIB_ALLREDUCE_ALGO", "auto")
    say(f"# commlib.bench: {n} ranks, dtype {args.dtype}, algo {algo}, "
        f"{commlib.mpi_library_version().splitlines()[0]}")
    say("# times are medians in us (slowest rank); bw in GB/s; ratio = other time / commlib time")
    head = f"{'op':<14}{'size':>10} {'commlib us':>11} {'algbw':>7} {'busbw':>7}"
    for other in names[1:]:
        head += f" {other + ' us':>11} {'busbw':>7} {'ratio':>6}"
    rows = []
    for op, nbytes in cases:
        if nbytes == cases[[c[0] for c in cases].index(op)][1]:
            say("")
            say(head)
        t = times[(op, nbytes)]
        row = {"op": op, "bytes": nbytes}
        line = f"{op:<14}{human(nbytes):>10}"
        for name in names:
            if name not in t:
                line += f" {'n/a':>11} {'':>7}" + (f" {'':>6}" if name != "commlib" else f" {'':>7}")
                continue
            algbw = nbytes / t[name] / 1e9
            busbw = algbw * bus_factor(op, n)
            row[name + "_us"], row[name + "_busbw"] = t[name] * 1e6, busbw
            if name == "commlib":
                line += f" {t[name] * 1e6:11.1f} {algbw:7.2f} {busbw:7.2f}"
            else:
                line += f" {t[name] * 1e6:11.1f} {busbw:7.2f} {t[name] / t['commlib']:6.2f}"
        rows.append(row)
        say(line)
    if fusion is not None:
        grouped, grouped_oop, separate, mpi = fusion
        say("")
        say(f"fusion, 128 x 4 KiB allreduce: 128 sequential MPI_Allreduce {mpi * 1e6:.1f} us; commlib "
            f"grouped_allreduce_async_ {grouped * 1e6:.1f} us (ratio {mpi / grouped:.2f}), "
            f"grouped_allreduce (out of place) {grouped_oop * 1e6:.1f} us "
            f"(ratio {mpi / grouped_oop:.2f}), "
            f"128 allreduce_async_ + synchronize {separate * 1e6:.1f} us (ratio {mpi / separate:.2f})")
    if tfusion is not None:
        separate, grouped, mpi = tfusion
        say(f"fusion, 128 x 4 KiB commlib.torch: 128 sequential MPI_Allreduce {mpi * 1e6:.1f} us; "
            f"128 allreduce_async_ + synchronize {separate * 1e6:.1f} us (ratio {mpi / separate:.2f}), "
            f"grouped_allreduce {grouped * 1e6:.1f} us (ratio {mpi / grouped:.2f})")
    if gfusion is not None:
        ag, ag_out, ag_mpi, rs, rs_mpi = gfusion
        say(f"fusion, 128 x 4 KiB allgather_async + synchronize {ag * 1e6:.1f} us (ratio {ag_mpi / ag:.2f}), "
            f"into given outs {ag_out * 1e6:.1f} us (ratio {ag_mpi / ag_out:.2f}) against 128 sequential "
            f"MPI_Allgather {ag_mpi * 1e6:.1f} us; 128 reducescatter_async "
            f"{rs * 1e6:.1f} us against 128 MPI_Reduce_scatter_block {rs_mpi * 1e6:.1f} us "
            f"(ratio {rs_mpi / rs:.2f})")
    if small is not None:
        say(small_calls.describe(small))
    if args.plot and me == 0:
        plot(rows, args.plot, n)
        say(f"# plot written to {args.plot}")
    commlib.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

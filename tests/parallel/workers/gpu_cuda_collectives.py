"""Run by tests/gpu: collectives on CUDA tensors (argv[1]: the path
COMMLIB_GPU_BACKEND selects, nccl or host) against the CPU path on the same
data, and bitwise identical across ranks. Values are small integers (exact in
every dtype, and in every summation order), so floating-point results must be
equal, not close."""
import sys
import time

import torch

from gpu_common import DEVICE
import commlib.gpu
import commlib.torch as hvd
from _common import done, fail

hvd.init()
r, n = hvd.rank(), hvd.size()
path = sys.argv[1]
if commlib.gpu.cuda_path() != path:
    fail(f"CUDA tensors take the {commlib.gpu.cuda_path()} path, expected {path}")

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8)
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}


def data(shape, dtype, salt):
    g = torch.Generator().manual_seed(1000 * salt + r)
    hi = 2 if dtype == torch.uint8 else 5
    return torch.randint(0, hi, shape, generator=g).to(dtype)


def same_everywhere(t, what):
    """t (CPU) is bitwise the same on every rank."""
    raw = t.contiguous().view(torch.uint8).numpy().reshape(1, -1)
    every = hvd.allgather(torch.from_numpy(raw.copy()), name=f"bits.{what}")
    if not all(torch.equal(every[i], every[0]) for i in range(n)):
        fail(f"{what}: results differ across ranks")


def check(got, want, what, same=True):
    """got equals want (the CPU path's result); same: and it is bitwise the
    same on every rank (not for reducescatter, whose ranks get their own parts)."""
    got = got.cpu() if isinstance(got, torch.Tensor) else got
    if got.device.type != "cpu" or got.dtype != want.dtype or got.shape != want.shape:
        fail(f"{what}: {got.dtype} {tuple(got.shape)} vs {want.dtype} {tuple(want.shape)}")
    if not torch.equal(got, want):
        fail(f"{what}: got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()}")
    if same:
        same_everywhere(got, what)


def on_both(fn, x, what, same=True, **kw):
    """fn on the CUDA copy of x and on x (CPU): the results must match."""
    got = fn(x.to(DEVICE), name="cuda." + what, **kw)
    want = fn(x, name="cpu." + what, **kw)
    if isinstance(got, tuple):
        for i, (g, w) in enumerate(zip(got, want)):
            if g.device.type != "cuda" and i == 0:
                fail(f"{what}: the result is not on the GPU")
            check(g, w, f"{what}[{i}]", same)
    else:
        if got.device != DEVICE:
            fail(f"{what}: the result is on {got.device}, not {DEVICE}")
        check(got, want, what, same)


for dtype in DTYPES:
    tag = str(dtype).replace("torch.", "")
    for opname, op in OPS.items():
        if op == hvd.Average and dtype not in FLOATS:
            continue
        x = data((33, 5), dtype, 1)
        on_both(hvd.allreduce, x, f"allreduce.{tag}.{opname}", op=op)
        y = x.to(DEVICE)
        hvd.allreduce_(y, op=op, name=f"inplace.{tag}.{opname}")
        check(y.cpu(), hvd.allreduce(x, op=op, name=f"inplace.cpu.{tag}.{opname}"), f"allreduce_.{tag}.{opname}")
        if op in (hvd.Sum, hvd.Average) and dtype in FLOATS:
            on_both(hvd.allreduce, x, f"scaled.{tag}.{opname}", op=op, prescale_factor=2.0, postscale_factor=0.5)
        if op in (hvd.Sum, hvd.Min, hvd.Max):
            rs = data((2 * n + 1, 3), dtype, 2)
            on_both(hvd.reducescatter, rs, f"reducescatter.{tag}.{opname}", same=False, op=op)
    on_both(hvd.allgather, data((r + 1, 4), dtype, 3), f"allgather.{tag}")
    on_both(hvd.broadcast, data((7,), dtype, 4), f"broadcast.{tag}", root_rank=n - 1)
    splits = [(i + r) % 3 for i in range(n)]
    on_both(hvd.alltoall, data((sum(splits), 2), dtype, 5), f"alltoall.{tag}", same=False, splits=splits)

# many small tensors at once: fused on the device
xs = [data((k + 1,), torch.float32, 10 + k) for k in range(40)]
handles = [hvd.allreduce_async(x.to(DEVICE), op=hvd.Sum, name=f"fused.{k}") for k, x in enumerate(xs)]
for k, (h, x) in enumerate(zip(handles, xs)):
    check(hvd.synchronize(h).cpu(), hvd.allreduce(x, op=hvd.Sum, name=f"fused.cpu.{k}"), f"fused.{k}")
got = hvd.grouped_allreduce([x.to(DEVICE) for x in xs[:5]], op=hvd.Average, name="grouped")
want = hvd.grouped_allreduce(xs[:5], op=hvd.Average, name="grouped.cpu")
for k, (g, w) in enumerate(zip(got, want)):
    check(g.cpu(), w, f"grouped.{k}")

# a grouped call refused by rank 1's device check (one CPU tensor among CUDA
# ones): the others' requests (through NCCL one allreduce per tensor, staged
# one request) fail at once, named and unnamed, and later groups still pair
for nm in (None, "grouped.refused"):
    for call in (hvd.grouped_allreduce_, hvd.grouped_allgather):
        group = [torch.ones(3, device=DEVICE), torch.ones(2, device=DEVICE if r != 1 else "cpu")]
        start = time.monotonic()
        try:
            call(group, name=nm)
        except ValueError as e:
            if r != 1 or "several devices" not in str(e):
                fail(f"{call.__name__} {nm}: rank {r} raised {e!r}")
        except hvd.CollectiveMismatchError as e:
            if r == 1 or "rank 1 could not submit" not in str(e):
                fail(f"{call.__name__} {nm}: rank {r} raised {e!r}")
        else:
            fail(f"{call.__name__} {nm}: rank {r} raised nothing")
        if time.monotonic() - start > 20:
            fail(f"{call.__name__} {nm}: the refusal took {time.monotonic() - start:.1f} s")
    got = hvd.grouped_allreduce([torch.full((2,), float(r), device=DEVICE)], op=hvd.Sum, name=nm)
    check(got[0].cpu(), torch.full((2,), n * (n - 1) / 2), f"grouped_allreduce {nm} after the refusal")
    got = hvd.grouped_allgather([torch.full((1,), float(r), device=DEVICE)], name=nm)
    check(got[0].cpu(), torch.arange(n, dtype=torch.float32), f"grouped_allgather {nm} after the refusal")

# a training loop's in-place allreduce_async_ of one name, step after step
# (submitted again as built the first time, cuda_nccl.allreduce_again): the
# same tensor, a new one each step (zero_grad), another stream, another
# op, another shape; every result against the CPU path's
grad = torch.zeros(17, 3, device=DEVICE)
side = torch.cuda.Stream(DEVICE)
for step in range(8):
    x = data((17, 3) if step != 6 else (4,), torch.float32, 20 + step)
    op = hvd.Max if step == 5 else hvd.Average
    if step in (2, 6):
        grad = torch.empty(x.shape, device=DEVICE)  # (new storage, same name)
    grad.copy_(x.to(DEVICE))
    if step == 4:
        side.wait_stream(torch.cuda.current_stream(DEVICE))
        with torch.cuda.stream(side):
            got = hvd.synchronize(hvd.allreduce_async_(grad, name="grad.repeated", op=op))
        torch.cuda.current_stream(DEVICE).wait_stream(side)
    else:
        got = hvd.synchronize(hvd.allreduce_async_(grad, name="grad.repeated", op=op))
    if got is not grad:
        fail(f"step {step}: synchronize of an in-place allreduce_async_ did not return its tensor")
    check(grad.cpu(), hvd.allreduce(x, op=op, name=f"grad.repeated.cpu.{step}"), f"grad.repeated.{step}")
done()

"""commlib.torch's CUDA routing, on CPU-only ranks: the host-staging steps
(cuda_staging.staged_call, which the CUDA path runs unchanged) applied to CPU
tensors give the direct CPU path's results, write in-place results into the
caller's tensor, snapshot the inputs at submission; tensors on other devices
(meta) are refused with a clear error; commlib.gpu.cuda_path() names the
path once. argv[1]: the path cuda_path() must choose here."""
import sys

import torch

import commlib.gpu
import commlib.torch as hvd
from commlib.torch.collectives import allreduce_ops, gather_ops, reducescatter_ops
from commlib.torch.cuda import cuda_staging
from _common import done, expect_raises, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()


def same(got, want, what):
    if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or got.shape != want.shape:
        fail(f"{what}: got {got!r} want {want!r}")
    if not torch.equal(got, want):
        fail(f"{what}: got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()}")


def staged(fn, tensors, inplace=False, keep_on_host=None, **kw):
    """fn (undecorated) through the staging steps."""
    return hvd.synchronize(cuda_staging.staged_call(lambda s: fn.__wrapped__(s, **kw), tensors, inplace, keep_on_host))


def direct(fn, tensors, **kw):
    return hvd.synchronize(fn(tensors, **kw))


# allreduce, out of place and in place, every dtype family and op
for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
    for op in (hvd.Sum, hvd.Min, hvd.Max):
        x = (torch.arange(10) % 7 + r).to(dtype)
        name = f"{dtype}.{op}"
        want = direct(allreduce_ops.allreduce_async, x.clone(), op=op, name="d." + name)
        got = staged(allreduce_ops.allreduce_async, x, op=op, name="s." + name)
        same(got, want, f"staged allreduce {name}")
        same(x, (torch.arange(10) % 7 + r).to(dtype), f"staged allreduce {name} left its input alone")
        y = x.clone()
        out = staged(allreduce_ops.allreduce_async_, y, inplace=True, op=op, name="i." + name)
        if out is not y:
            fail("staged in-place allreduce did not return the caller's tensor")
        same(y, want, f"staged in-place allreduce {name} wrote into the caller's tensor")

# Average with scale factors (float64: exact)
x = torch.linspace(0, 1, 12, dtype=torch.float64) * (r + 1)
same(staged(allreduce_ops.allreduce_async, x, op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5,
            name="s.avg"),
     direct(allreduce_ops.allreduce_async, x, op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5,
            name="d.avg"), "staged Average with scale factors")

# Adasum (which CUDA tensors always take through the staging steps: NCCL cannot run it)
x = torch.linspace(-1, 1, 12, dtype=torch.float32) * (r + 1) + r
same(staged(allreduce_ops.allreduce_async, x, op=hvd.Adasum, name="s.adasum"),
     direct(allreduce_ops.allreduce_async, x, op=hvd.Adasum, name="d.adasum"), "staged Adasum")
xs = [x, x[:5].clone() * 3]
want = direct(allreduce_ops.grouped_allreduce_async, xs, op=hvd.Adasum, name="d.gadasum")
got = staged(allreduce_ops.grouped_allreduce_async, xs, op=hvd.Adasum, name="s.gadasum")
for i, (g, w) in enumerate(zip(got, want)):
    same(g, w, f"staged grouped Adasum tensor {i}")

# the inputs are taken at submission: changing them before synchronize changes nothing
x = torch.full((1000,), float(r + 1))
h = cuda_staging.staged_call(lambda s: allreduce_ops.allreduce_async.__wrapped__(s, op=hvd.Sum, name="snap"),
                             x, False)
x.fill_(1e6)
same(hvd.synchronize(h), torch.full((1000,), float(n * (n + 1) / 2)), "staged input snapshot")

# grouped, in place
ts = [torch.full((3,), float(r)), torch.arange(4, dtype=torch.int32) * (r + 1)]
outs = staged(allreduce_ops.grouped_allreduce_async_, ts, inplace=True, op=hvd.Sum, name="grp")
if outs[0] is not ts[0] or outs[1] is not ts[1]:
    fail("staged grouped in-place allreduce did not return the caller's tensors")
same(ts[0], torch.full((3,), float(n * (n - 1) / 2)), "staged grouped allreduce [0]")
same(ts[1], torch.arange(4, dtype=torch.int32) * (n * (n + 1) // 2), "staged grouped allreduce [1]")

# allgather (uneven rows), broadcast in place, alltoall (splits stay on the host), reducescatter
x = torch.arange((r + 1) * 2, dtype=torch.float32).view(r + 1, 2) + 100 * r
same(staged(gather_ops.allgather_async, x, name="s.ag"), direct(gather_ops.allgather_async, x, name="d.ag"),
     "staged allgather")
b = torch.arange(5, dtype=torch.int16) + r
staged(gather_ops.broadcast_async_, b, inplace=True, root_rank=n - 1, name="s.bc")
same(b, torch.arange(5, dtype=torch.int16) + n - 1, "staged in-place broadcast")
splits = [(i + r) % 3 for i in range(n)]
x = torch.arange(sum(splits) * 3, dtype=torch.float64).view(-1, 3) + 1000 * r
got_out, got_splits = staged(gather_ops.alltoall_async, x, keep_on_host=1, splits=splits, name="s.a2a")
want_out, want_splits = direct(gather_ops.alltoall_async, x, splits=splits, name="d.a2a")
same(got_out, want_out, "staged alltoall output")
same(got_splits, want_splits, "staged alltoall received splits")
x = torch.arange(n * 2 + 1, dtype=torch.float32).repeat(2, 1).t().contiguous() * (r + 1)
same(staged(reducescatter_ops.reducescatter_async, x, op=hvd.Sum, name="s.rs"),
     direct(reducescatter_ops.reducescatter_async, x, op=hvd.Sum, name="d.rs"), "staged reducescatter")

# devices other than CPU and CUDA are refused by name, before anything is sent
meta = torch.empty(4, device="meta")
for fn, kw in ((hvd.allreduce_async, {}), (hvd.allgather_async, {}), (hvd.broadcast_async_, {"root_rank": 0}),
               (hvd.grouped_allreduce_async, {})):
    arg = [meta] if fn is hvd.grouped_allreduce_async else meta
    expect_raises(ValueError, lambda: fn(arg, **kw), f"{fn.__name__} on meta",
                  match="on device meta, but commlib.torch supports CPU and CUDA tensors only")

# the path CUDA tensors would take here, announced once
want_path = sys.argv[1]
if commlib.gpu.cuda_path() != want_path or commlib.gpu.cuda_path() != want_path:
    fail(f"cuda_path() is not {want_path}")
same(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after"), torch.full((2,), float(n)), "allreduce after")
done()

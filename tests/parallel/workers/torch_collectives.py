"""commlib.torch collectives on every rank against numpy/torch expectations:
every op and dtype, in-place/async forms, autograd, compression, argument
errors, cross-rank mismatches, objects, join/barrier, SyncBatchNorm."""
import copy
import pickle
import threading

import numpy as np
import torch

import commlib
import commlib.torch as hvd
from _common import check_equal, done, expect_raises, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(1234)  # the same on every rank: per-rank data is derived below

DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.bool]


def rank_tensor(rank, dtype, shape=(3, 4)):
    """Deterministic per-rank data that stays exact in every dtype."""
    base = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)
    vals = (base * (rank + 1) + rank) % 5 + 1  # 1..5: no overflow for Product in int8 at n <= 3
    if dtype == torch.bool:
        return (vals > 2 + rank % 2)
    return vals.to(dtype)


def expect(vals_by_rank, op):
    stack = torch.stack([v.to(torch.float64) for v in vals_by_rank])
    return {hvd.Sum: stack.sum(0), hvd.Average: stack.mean(0), hvd.Min: stack.min(0).values,
            hvd.Max: stack.max(0).values, hvd.Product: stack.prod(0)}[op]


def close(got, want, what, tol=0.0):
    got = got.detach().to(torch.float64)
    want = want.detach().to(torch.float64)
    if got.shape != want.shape:
        fail(f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    if not torch.allclose(got, want, rtol=tol, atol=tol):
        fail(f"{what}: got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()}")


# ------------------------------------------------------------ allreduce, all dtypes and ops
for dtype in DTYPES:
    mine = rank_tensor(r, dtype)
    everyone = [rank_tensor(k, dtype) for k in range(n)]
    ops = [hvd.Sum, hvd.Min, hvd.Max, hvd.Product]
    if dtype.is_floating_point:
        ops.append(hvd.Average)
    for op in ops:
        tag = f"allreduce {dtype} op {op}"
        if dtype == torch.bool:
            stack = torch.stack(everyone)
            want = stack.any(0) if op in (hvd.Sum, hvd.Max) else stack.all(0)
            got = hvd.allreduce(mine, op=op, name=f"ar.{dtype}.{op}")
            if got.dtype != torch.bool or not torch.equal(got, want):
                fail(f"{tag}: {got} != {want}")
            continue
        want = expect(everyone, op)
        tol = {torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float32: 1e-6}.get(dtype, 1e-12)
        got = hvd.allreduce(mine, op=op, name=f"ar.{dtype}.{op}")
        if got.dtype != dtype:
            fail(f"{tag}: dtype {got.dtype}")
        close(got, want.to(dtype), tag, tol)
        if not torch.equal(mine, rank_tensor(r, dtype)):
            fail(f"{tag}: the input was modified")
        # in place: the result lands in the tensor's own memory
        t = rank_tensor(r, dtype)
        ptr = t.data_ptr()
        out = hvd.allreduce_(t, op=op, name=f"ar_.{dtype}.{op}")
        if out is not t or t.data_ptr() != ptr:
            fail(f"{tag}: allreduce_ did not return/write the input tensor")
        close(t, want.to(dtype), tag + " in place", tol)

# default op is Average, deprecated average= still works, scale factors
x = torch.full((5,), float(r + 1))
close(hvd.allreduce(x), torch.full((5,), (n + 1) / 2), "default Average")
close(hvd.allreduce(x, average=False), torch.full((5,), n * (n + 1) / 2), "average=False")
close(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
      torch.full((5,), n * (n + 1) / 2), "pre/postscale")
close(hvd.allreduce(x, op=hvd.Average, prescale_factor=3.0),
      torch.full((5,), 3 * (n + 1) / 2), "Average with prescale")
# 0-d, empty, non-contiguous (out of place copies), async + poll
close(hvd.allreduce(torch.tensor(float(r)), op=hvd.Sum), torch.tensor(n * (n - 1) / 2), "0-d")
z = torch.tensor(float(r))
hvd.allreduce_(z, op=hvd.Sum)
close(z, torch.tensor(n * (n - 1) / 2), "0-d in place")
close(hvd.allreduce(torch.zeros(0, 3)), torch.zeros(0, 3), "empty")
nc = torch.arange(12.).reshape(3, 4).t() * (r + 1)
close(hvd.allreduce(nc, op=hvd.Sum), torch.arange(12.).reshape(3, 4).t() * n * (n + 1) / 2,
      "non-contiguous input")
h = hvd.allreduce_async(x, op=hvd.Max, name="async.max")
while not hvd.poll(h):
    pass
close(hvd.synchronize(h), torch.full((5,), float(n)), "allreduce_async")
y = x.clone()
h = hvd.allreduce_async_(y, op=hvd.Min)
close(hvd.synchronize(h), torch.ones(5), "allreduce_async_")
close(y, torch.ones(5), "allreduce_async_ wrote in place")

# ------------------------------------------------------------ grouped allreduce
ts = [torch.full((2, 3), float(r)), torch.full((4,), 2.0 * r, dtype=torch.float64),
      torch.tensor(float(r + 1))]
outs = hvd.grouped_allreduce(ts, op=hvd.Sum)
close(outs[0], torch.full((2, 3), n * (n - 1) / 2), "grouped 0")
close(outs[1], torch.full((4,), n * (n - 1.0)), "grouped 1")
close(outs[2], torch.tensor(n * (n + 1) / 2), "grouped 2 (0-d)")
ts2 = [t.clone() for t in ts]
res = hvd.grouped_allreduce_(ts2, op=hvd.Sum)
if res[0] is not ts2[0]:
    fail("grouped_allreduce_ did not return its inputs")
close(ts2[1], torch.full((4,), n * (n - 1.0)), "grouped in place")
h = hvd.grouped_allreduce_async(ts, name="grp.async")
close(hvd.synchronize(h)[0], torch.full((2, 3), (n - 1) / 2), "grouped async Average")

# ------------------------------------------------------------ sparse allreduce
dense = torch.zeros(6, 2)
dense[r] = r + 1.0
dense[5] = 1.0
want = torch.zeros(6, 2)
for k in range(n):
    want[k] += k + 1.0
want[5] = float(n)
for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
    got = hvd.synchronize(hvd.sparse_allreduce_async(dense.to_sparse(), f"sp.{op}", op))
    if not got.is_sparse:
        fail("sparse_allreduce_async did not return a sparse tensor")
    close(got.to_dense(), want * scale, f"sparse_allreduce_async {op}")
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), f"sp.call.{op}", op)
    close(handle().to_dense(), want * scale, f"sparse_allreduce_async {op}: handle() (Horovod)")
if hvd.start_timeline is not commlib.start_timeline or hvd.stop_timeline is not commlib.stop_timeline:
    fail("hvd.start_timeline/stop_timeline are not commlib's timeline")

# ------------------------------------------------------------ allgather (uneven rows)
for dtype in DTYPES:
    mine = rank_tensor(r, dtype, (r + 1, 3))
    want = torch.cat([rank_tensor(k, dtype, (k + 1, 3)) for k in range(n)])
    got = hvd.allgather(mine, name=f"ag.{dtype}")
    if got.dtype != dtype or not torch.equal(got, want):
        fail(f"allgather {dtype}: {got} != {want}")
# repeated under one name (the request submitted again): the data changed in
# place, the tensor's storage swapped (.data), a non-contiguous input, 2-D rows,
# then a 0-d tensor described before by an allreduce, refused as a first call is
rep = torch.zeros(r + 1, 2)
for k in range(3):
    rep.fill_(r + 10 * k)
    want = torch.cat([torch.full((q + 1, 2), float(q + 10 * k)) for q in range(n)])
    close(hvd.allgather(rep, name="ag.repeat"), want, f"repeated allgather {k}")
rep.data = torch.full((2, 3), float(r))
close(hvd.allgather(rep, name="ag.repeat"), torch.cat([torch.full((2, 3), float(q)) for q in range(n)]),
      "repeated allgather after .data was replaced")
wide = torch.arange(6.0).reshape(2, 3) + r
for k in range(2):
    close(hvd.allgather(wide.t(), name="ag.strided"), torch.cat([(torch.arange(6.0).reshape(2, 3) + q).t()
                                                                  for q in range(n)]), f"non-contiguous allgather {k}")
scalar = torch.tensor(float(r))
hvd.allreduce_(scalar, name="ar.scalar", op=hvd.Sum)
expect_raises(ValueError, lambda: hvd.allgather(scalar, name="ag.scalar"), "0-d allgather", match="0-d")
h = hvd.allgather_async(torch.full((2,), r, dtype=torch.int32))
check_equal(hvd.synchronize(h).numpy(), np.repeat(np.arange(n, dtype=np.int32), 2), "allgather_async")
got = hvd.grouped_allgather([torch.full((1,), r), torch.full((r + 1, 2), r)])
check_equal(got[0].numpy(), np.arange(n), "grouped_allgather 0")
if got[1].shape != (n * (n + 1) // 2, 2):
    fail(f"grouped_allgather 1 shape {got[1].shape}")

# ------------------------------------------------------------ broadcast
for root in range(n):
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        mine = rank_tensor(r, dtype)
        got = hvd.broadcast(mine, root, name=f"bc.{root}.{dtype}")
        if not torch.equal(got, rank_tensor(root, dtype)):
            fail(f"broadcast root {root} {dtype}")
        if not torch.equal(mine, rank_tensor(r, dtype)):
            fail("broadcast modified its input")
    t = rank_tensor(r, torch.float32)
    hvd.broadcast_(t, root)
    close(t, rank_tensor(root, torch.float32), f"broadcast_ root {root}")
    t = torch.tensor(float(r))
    hvd.synchronize(hvd.broadcast_async_(t, root))
    close(t, torch.tensor(float(root)), "broadcast_async_ 0-d")
    close(hvd.synchronize(hvd.broadcast_async(torch.full((3,), float(r)), root)),
          torch.full((3,), float(root)), "broadcast_async")

# ------------------------------------------------------------ alltoall
mine = torch.arange(2 * n, dtype=torch.float32).reshape(2 * n, 1) + 100 * r
out = hvd.alltoall(mine)
want = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32).reshape(2, 1) + 100 * k
                  for k in range(n)])
close(out, want, "alltoall even")
# uneven: rank r sends k+1 rows to rank k
splits = [k + 1 for k in range(n)]
rows = sum(splits)
mine = torch.full((rows, 2), float(r))
out, received = hvd.alltoall(mine, splits=splits)
check_equal(received.numpy(), np.full(n, r + 1, dtype=np.int32), "alltoall received splits")
close(out, torch.cat([torch.full((r + 1, 2), float(k)) for k in range(n)]), "alltoall uneven")
out, received = hvd.synchronize(hvd.alltoall_async(mine, splits=torch.tensor(splits)))
check_equal(received.numpy(), np.full(n, r + 1, dtype=np.int32), "alltoall_async received")
expect_raises(ValueError, lambda: hvd.alltoall(torch.ones(n + 1) if n > 1 else torch.ones(3),
                                               splits=[1] * n), "alltoall bad splits")

# ------------------------------------------------------------ reducescatter
rows = 2 * n + 1
mine = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * (r + 1)
full = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * n * (n + 1) / 2
sizes = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
start = sum(sizes[:r])
close(hvd.reducescatter(mine, op=hvd.Sum), full[start:start + sizes[r]], "reducescatter Sum")
close(hvd.reducescatter(mine), full[start:start + sizes[r]] / n, "reducescatter Average")
close(hvd.synchronize(hvd.reducescatter_async(mine, op=hvd.Sum, postscale_factor=2.0)),
      2 * full[start:start + sizes[r]], "reducescatter_async")

# ------------------------------------------------------------ repeated under one name
# (each call after the first submits its request again): the data changed in
# place, the arguments changed under the name, the storage swapped (.data);
# every result a new tensor that later calls leave alone
seen = []
reps = [torch.zeros(2 * n, 2) for _ in range(6)]  # (one per collective: a buffer remembers its last request)
for step in range(8):  # (the arguments change every other step; the data every step)
    k = step // 2
    for rep in reps:
        rep.copy_(torch.arange(4.0 * n).reshape(2 * n, 2) * (r + 1) + step)
    every = [torch.arange(4.0 * n).reshape(2 * n, 2) * (q + 1) + step for q in range(n)]
    op = (hvd.Sum, hvd.Max)[k % 2]
    want = sum(every) if op == hvd.Sum else torch.stack(every).amax(0)
    pre = 2.0 if k == 2 else 1.0  # (scale factors only with Sum)
    got = hvd.allreduce(reps[0], op=op, name="rep.ar", prescale_factor=pre)
    close(got, want * pre, f"step {step}: repeated allreduce {k}")
    root = k % n
    bc = hvd.broadcast(reps[1], root, name="rep.bc")
    close(bc, every[root], f"step {step}: repeated broadcast {k}")
    a2a = hvd.alltoall(reps[2], name="rep.a2a")  # (blocking, no splits: the received rows only)
    close(a2a, torch.cat([e[2 * r:2 * r + 2] for e in every]), f"step {step}: repeated alltoall {k}")
    if step % 4 == 3:  # (the same name's asynchronous form in between)
        out, received = hvd.synchronize(hvd.alltoall_async(reps[2], name="rep.a2a"))
        close(out, a2a, f"step {step}: alltoall_async under the blocking one's name")
    out, received = hvd.synchronize(hvd.alltoall_async(reps[3], name="rep.a2a.async"))
    close(out, torch.cat([e[2 * r:2 * r + 2] for e in every]), f"step {step}: repeated alltoall_async")
    check_equal(received.numpy(), np.full(n, 2, dtype=np.int32), f"step {step}: alltoall received")
    splits = [(q + k) % 3 for q in range(n)]
    splits[-1] = 2 * n - sum(splits[:-1])
    out, received = hvd.alltoall(reps[4], splits=splits, name="rep.a2a.uneven")
    lo = sum(splits[:r])
    close(out, torch.cat([e[lo:lo + splits[r]] for e in every]), f"step {step}: repeated uneven alltoall")
    check_equal(received.numpy(), np.full(n, splits[r], dtype=np.int32), f"step {step}: uneven received")
    post = 1.0 + k if op == hvd.Sum else 1.0
    rs = hvd.reducescatter(reps[5], op=op, name="rep.rs", postscale_factor=post)
    close(rs, (want * post)[2 * r:2 * r + 2], f"step {step}: repeated reducescatter {k}")
    seen.append([(got.clone(), got), (bc.clone(), bc), (rs.clone(), rs), (a2a.clone(), a2a)])
for step, results in enumerate(seen):
    for what, (want, got) in zip(("allreduce", "broadcast", "reducescatter", "alltoall"), results):
        close(got, want, f"{what} result of step {step} after later calls")
# a new tensor every call under one name (a metric's): 0-d, 1-d, another dtype and shape
fresh = []
for step in range(4):
    loss = torch.tensor(float(r + step))
    avg = hvd.allreduce(loss, name="metric.loss")
    close(avg, torch.tensor((n - 1) / 2 + step), f"step {step}: metric average")
    close(loss, torch.tensor(float(r + step)), f"step {step}: the metric's input unchanged")
    counts = torch.arange(3, dtype=torch.int64 if step % 2 else torch.int32) + r + step
    total = hvd.allreduce(counts, name="metric.counts", op=hvd.Sum)
    if total.dtype != counts.dtype:
        fail(f"step {step}: a metric's sum came back as {total.dtype}")
    close(total.double(), (torch.arange(3) * n + n * (n - 1) / 2 + n * step).double(), f"step {step}: metric sum")
    wide = hvd.allreduce(torch.full((step + 1, 2), float(r)), name="metric.wide", op=hvd.Sum)
    close(wide, torch.full((step + 1, 2), n * (n - 1) / 2), f"step {step}: metric of a new shape")
    rows = hvd.allgather(torch.full((r + 1, 2), float(r + step)), name="metric.rows")
    close(rows, torch.cat([torch.full((q + 1, 2), float(q + step)) for q in range(n)]),
          f"step {step}: allgather of a new tensor")
    ids = hvd.allgather(torch.tensor([r * 10 + step], dtype=torch.int64 if step % 2 else torch.int32),
                        name="metric.ids")
    check_equal(ids.numpy(), np.array([q * 10 + step for q in range(n)], np.int64 if step % 2 else np.int32),
                f"step {step}: allgather of ids")
    fresh.append((avg.clone(), avg))
    fresh.append((rows.clone(), rows))
for step, (want, got) in enumerate(fresh):
    close(got, want, f"metric result of step {step} after later calls")
for rep in reps:
    rep.data = torch.full((n, 3), float(r))
close(hvd.allreduce(reps[0], op=hvd.Sum, name="rep.ar"), torch.full((n, 3), n * (n - 1) / 2),
      "repeated allreduce after .data was replaced")
close(hvd.broadcast(reps[1], 0, name="rep.bc"), torch.zeros(n, 3), "repeated broadcast after .data")
close(hvd.reducescatter(reps[5], op=hvd.Sum, name="rep.rs"), torch.full((1, 3), n * (n - 1) / 2),
      "repeated reducescatter after .data")
close(hvd.alltoall(reps[2], name="rep.a2a"), torch.arange(float(n)).repeat_interleave(3).reshape(n, 3),
      "repeated alltoall after .data")

# ------------------------------------------------------------ compression
g = torch.linspace(-1, 1, 50) * (r + 1)
want = torch.linspace(-1, 1, 50) * (n + 1) / 2
for comp, tol in ((hvd.Compression.none, 1e-6), (hvd.Compression.fp16, 2e-3),
                  (hvd.Compression.bf16, 2e-2)):
    got = hvd.allreduce(g, compression=comp)
    if got.dtype != torch.float32:
        fail(f"compression {comp.__name__} returned {got.dtype}")
    close(got, want, f"compression {comp.__name__}", tol)
c, ctx = hvd.Compression.fp16.compress(g)
if c.dtype != torch.float16 or hvd.Compression.fp16.decompress(c, ctx).dtype != torch.float32:
    fail("fp16 compressor dtypes")
ci, ctx = hvd.Compression.fp16.compress(torch.ones(2, dtype=torch.int64))
if ci.dtype != torch.int64:
    fail("fp16 compressor must leave integer tensors alone")

# ------------------------------------------------------------ autograd
w = torch.full((4,), float(r + 1), requires_grad=True)
for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
    w.grad = None
    y = hvd.allreduce(w, op=op)
    (y * torch.arange(4.)).sum().backward()
    # d/dw_r of sum_over_ranks(loss): the allreduce (same op) of the output gradients
    close(w.grad, torch.arange(4.) * n * scale, f"allreduce grad {op}")
w.grad = None
y = hvd.allreduce(w, op=hvd.Sum, prescale_factor=2.0, postscale_factor=3.0)
y.sum().backward()
close(w.grad, torch.full((4,), 6.0 * n), "allreduce grad with scale factors")
w.grad = None
y = hvd.allreduce(w, op=hvd.Max)
y.sum().backward()
close(w.grad, torch.full((4,), float(n) if r == n - 1 else 0.0), "allreduce Max grad")
# allgather: gradient of my rows = average over ranks of the output gradient
a = torch.full((r + 1, 2), float(r), requires_grad=True)
g_out = hvd.allgather(a)
(g_out * (torch.arange(g_out.shape[0], dtype=torch.float32) + 1).unsqueeze(1) * (r + 1)).sum().backward()
off = r * (r + 1) // 2
want = (torch.arange(off, off + r + 1, dtype=torch.float32) + 1).unsqueeze(1).expand(r + 1, 2) \
    * (n + 1) / 2
close(a.grad, want, "allgather grad")
# broadcast: root gets the average of the gradients, others zero
b = torch.full((3,), float(r), requires_grad=True)
(hvd.broadcast(b, 0) * (r + 1)).sum().backward()
close(b.grad, torch.full((3,), (n + 1) / 2 if r == 0 else 0.0), "broadcast grad")
# alltoall: gradients travel back
c = torch.ones(n, 2, requires_grad=True)
(hvd.alltoall(c) * (r + 1)).sum().backward()
close(c.grad, torch.arange(1., n + 1).unsqueeze(1).expand(n, 2), "alltoall grad")
# reducescatter (Sum): Horovod's, the allgather of the output gradients times size
d = torch.ones(2 * n, requires_grad=True)
(hvd.reducescatter(d, op=hvd.Sum) * (r + 1)).sum().backward()
close(d.grad, torch.arange(1., n + 1).repeat_interleave(2) * n, "reducescatter grad")
# grouped allreduce
e1, e2 = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
o1, o2 = hvd.grouped_allreduce([e1, e2], op=hvd.Sum)
(o1.sum() * (r + 1) + o2.sum()).backward()
close(e1.grad, torch.full((2,), n * (n + 1) / 2), "grouped grad 0")
close(e2.grad, torch.full((3,), float(n)), "grouped grad 1")

# grouped allgather and reducescatter: per tensor, the gradients of the single forms
f1, f2 = torch.full((r + 1,), float(r), requires_grad=True), torch.ones(2 * n, 3, requires_grad=True)
q1, = hvd.grouped_allgather([f1])
q2, = hvd.grouped_reducescatter([f2], op=hvd.Average)
((q1 * (torch.arange(q1.shape[0], dtype=torch.float32) + 1)).sum() * (r + 1)
 + (q2 * (r + 1)).sum()).backward()
close(f1.grad, (torch.arange(off, off + r + 1, dtype=torch.float32) + 1) * (n + 1) / 2,
      "grouped_allgather grad")
close(f2.grad, torch.arange(1., n + 1).repeat_interleave(2).unsqueeze(1).expand(2 * n, 3),
      "grouped_reducescatter Average grad (Horovod's: no 1/size)")
g1, g2 = torch.ones(3, requires_grad=True), torch.ones(n, 2, requires_grad=True)
q1, q2 = hvd.grouped_allgather([g1, g2], name="grouped.ag.two")
(q1.sum() + 2 * q2.sum()).backward()
close(g1.grad, torch.ones(3), "grouped_allgather grad, two tensors (0)")
close(g2.grad, torch.full((n, 2), 2.0), "grouped_allgather grad, two tensors (1)")
# a 0-d tensor: Horovod's error (a ValueError that is also a HorovodInternalError), nothing sent
for fn in (lambda: hvd.reducescatter(torch.tensor(1.0)),
           lambda: hvd.grouped_reducescatter([torch.ones(2 * n), torch.tensor(1.0)]),
           lambda: hvd.grouped_allgather([torch.ones(2), torch.tensor(1.0)])):
    e = expect_raises(ValueError, fn, "0-d tensor", match="0-d")
    if not isinstance(e, (hvd.HorovodInternalError, RuntimeError, hvd.ScalarTensorError)):
        fail(f"0-d error is not a HorovodInternalError: {type(e)}")
# allgather reads dimension 0 in its autograd function: a 0-d tensor or a
# non-tensor is refused as by allgather_async, not with IndexError/AttributeError
expect_raises(hvd.ScalarTensorError, lambda: hvd.allgather(torch.tensor(1.0)), "allgather of a 0-d tensor")
expect_raises(TypeError, lambda: hvd.allgather([1.0, 2.0]), "allgather of a list", match="torch.Tensor")
# a grouped collective takes a list: one tensor (it would be taken as the list
# of its rows), an array or None is refused, as is a non-tensor in the list
for fn in (hvd.grouped_allreduce, hvd.grouped_allreduce_async, hvd.grouped_allreduce_,
           hvd.grouped_allgather, hvd.grouped_allgather_async, hvd.grouped_reducescatter,
           hvd.grouped_reducescatter_async):
    for bad in (torch.ones(2 * n), torch.tensor(1.0), np.ones(2 * n, np.float32), None):
        expect_raises(TypeError, lambda: fn(bad), f"{fn.__name__} of {type(bad).__name__}",
                      match="takes a list of tensors")
    expect_raises(TypeError, lambda: fn([torch.ones(2 * n), 1.0]), f"{fn.__name__} with a float in the list",
                  match="torch.Tensor")
for bad in ("2", None, True):  # scale factors are numbers (float("2") parsed the string)
    expect_raises(TypeError, lambda: hvd.allreduce_(torch.ones(2), prescale_factor=bad),
                  f"allreduce_ prescale {bad!r}", match="prescale_factor must be a real number")
    expect_raises(TypeError, lambda: hvd.grouped_allreduce([torch.ones(2)], postscale_factor=bad),
                  f"grouped_allreduce postscale {bad!r}", match="postscale_factor must be a real number")
# alltoall splits are counts: floats are refused, not truncated (as by the numpy API)
for bad in ([1.5] * n, [1.0] * n, np.full(n, 1.0), [True] * n, torch.ones(n, dtype=torch.bool)):
    expect_raises(ValueError, lambda: hvd.alltoall(torch.ones(n), splits=bad), f"alltoall splits {bad!r}",
                  match="integer")
got = hvd.grouped_allreduce((t for t in (torch.ones(2), torch.ones(3))), op=hvd.Sum)
check_equal(got[1].numpy(), np.full(3, float(n), np.float32), "grouped_allreduce of a generator")
if not issubclass(hvd.RankLostError, hvd.HorovodInternalError):
    fail("RankLostError must be caught by except hvd.HorovodInternalError")
if not issubclass(hvd.HostsUpdatedInterrupt, RuntimeError):
    fail("HostsUpdatedInterrupt")

# ------------------------------------------------------------ Horovod's other integer dtypes
for dt, npdt in ((torch.int16, np.int16), (torch.uint16, np.uint16), (torch.uint32, np.uint32),
                 (torch.uint64, np.uint64)):
    vals = [np.array([k + 1, 60000, 3], dtype=np.int64).astype(npdt) for k in range(n)]
    total = vals[0]
    for v in vals[1:]:
        total = np.add(total, v, dtype=npdt)  # wraps around, as numpy does
    x = torch.tensor(vals[r])
    check_equal(hvd.allreduce(x, op=hvd.Sum).numpy(), total, f"allreduce Sum {dt}")
    check_equal(hvd.allreduce(x, op=hvd.Average).numpy(),
                np.trunc(total.astype(np.float64) * (1.0 / n)).astype(npdt),
                f"allreduce Average {dt}")
    y = x.clone()
    hvd.broadcast_(y, n - 1)
    check_equal(y.numpy(), np.array([n, 60000, 3], np.int64).astype(npdt), f"broadcast_ {dt}")
    check_equal(hvd.allgather(x[:1]).numpy(), np.arange(1, n + 1).astype(npdt), f"allgather {dt}")

# ------------------------------------------------------------ argument errors (local, no collective)
expect_raises(TypeError, lambda: hvd.allgather(torch.ones(3, dtype=torch.complex64)), "complex")
expect_raises(ValueError, lambda: hvd.allreduce(torch.ones(3, device="meta")), "meta device",
              "CPU and CUDA tensors only")
expect_raises(ValueError, lambda: hvd.allreduce_(torch.ones(4, 3).t()), "non-contiguous in place",
              "contiguous")
expect_raises(TypeError, lambda: hvd.allreduce(np.ones(3)), "numpy input")
expect_raises(TypeError, lambda: hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum),
              "Adasum of int32", match="Adasum")
expect_raises(TypeError, lambda: hvd.allreduce(torch.ones(3), process_set=object()),
              "process set of the wrong type")
expect_raises(ValueError, lambda: hvd.allreduce(torch.ones(3), process_set=hvd.ProcessSet([0])),
              "unregistered process set", match="not registered")
expect_raises(ValueError, lambda: hvd.allreduce(torch.ones(3), average=True, op=hvd.Sum),
              "average and op")
expect_raises(ValueError, lambda: hvd.broadcast(torch.ones(3), n), "root out of range")
expect_raises(TypeError, lambda: hvd.synchronize(42), "synchronize(non-handle)")
close(hvd.allreduce(torch.ones(3), process_set=hvd.global_process_set, op=hvd.Sum),
      torch.full((3,), float(n)), "global_process_set accepted")

# ------------------------------------------------------------ cross-rank mismatches
odd = r == n - 1
err = expect_raises(hvd.CollectiveMismatchError,
                    lambda: hvd.allreduce(torch.ones(5 if odd else 4), name="mm.shape"),
                    "shape mismatch")
if "'mm.shape'" not in str(err) or "shape" not in str(err):
    fail(f"mismatch message: {err}")
expect_raises(hvd.CollectiveMismatchError,
              lambda: hvd.allreduce(torch.ones(4, dtype=torch.float64 if odd else torch.float32),
                                    name="mm.dtype"), "dtype mismatch")
expect_raises(hvd.CollectiveMismatchError,
              lambda: hvd.broadcast(torch.ones(3), 1 if odd else 0, name="mm.root"),
              "root mismatch")
close(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)), "after mismatches")

# ------------------------------------------------------------ objects, barrier, join
obj = {"rank": r, "data": list(range(r + 1)), "fn": (lambda v: v + 1) if r == 0 else None}
got = hvd.broadcast_object(obj if r == 0 else None, root_rank=0)
if got["rank"] != 0 or got["data"] != [0] or got["fn"](1) != 2:
    fail(f"broadcast_object: {got}")
got = hvd.broadcast_object({"from": r, "t": torch.arange(3) * r}, root_rank=n - 1, name="bo2")
if got["from"] != n - 1 or not torch.equal(got["t"], torch.arange(3) * (n - 1)):
    fail(f"broadcast_object root {n - 1}: {got}")
gathered = hvd.allgather_object({"r": r, "s": "x" * (r * 100)})
if [g["r"] for g in gathered] != list(range(n)) or len(gathered[-1]["s"]) != (n - 1) * 100:
    fail("allgather_object")
# An object that cannot be pickled fails every rank at once (its own: the
# pickler's TypeError; the others: PicklingError naming it), unnamed too.
lock = threading.Lock()
if r == 0:
    expect_raises(TypeError, lambda: hvd.broadcast_object(lock, root_rank=0), "broadcast_object of a lock",
                  match="lock")
else:
    expect_raises(pickle.PicklingError, lambda: hvd.broadcast_object(None, root_rank=0),
                  "broadcast_object of the root's lock", match="rank 0 could not pickle its object (TypeError")
mine = lock if r == n - 1 else r
if r == n - 1:
    expect_raises(TypeError, lambda: hvd.allgather_object(mine), "allgather_object of a lock", match="lock")
else:
    expect_raises(pickle.PicklingError, lambda: hvd.allgather_object(mine), "allgather_object with a lock",
                  match=f"rank {n - 1}: TypeError")
if hvd.allgather_object(r) != list(range(n)):
    fail("allgather_object after an unpicklable object")
hvd.barrier()
last = hvd.join()
lasts = hvd.allgather(torch.tensor([last]))
if not (0 <= last < n) or not torch.all(lasts == last):
    fail(f"join returned {lasts.tolist()}")

# ------------------------------------------------------------ SyncBatchNorm vs BatchNorm on the full batch
for shape, dtype, momentum in (((4, 3, 5), torch.float64, 0.1), ((3, 2, 4, 4), torch.float64, None),
                               ((5, 3), torch.float32, 0.3)):
    gen = torch.Generator().manual_seed(7)
    per_rank = [torch.randn((shape[0] + k,) + shape[1:], generator=gen, dtype=dtype) * 3 + 1
                for k in range(n)]
    full = torch.cat(per_rank)
    c = shape[1]
    ref = torch.nn.BatchNorm1d(c, momentum=momentum, dtype=dtype) if len(shape) <= 3 else \
        torch.nn.BatchNorm2d(c, momentum=momentum, dtype=dtype)
    sbn = hvd.SyncBatchNorm(c, momentum=momentum, dtype=dtype)
    with torch.no_grad():
        for m in (ref, sbn):
            m.weight.copy_(torch.linspace(0.5, 2, c, dtype=dtype))
            m.bias.copy_(torch.linspace(-1, 1, c, dtype=dtype))
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    for it in range(2):  # two steps: running stats (and momentum=None averaging) too
        xr = per_rank[r].clone().requires_grad_(True)
        xf = full.clone().requires_grad_(True)
        up = torch.randn(full.shape, generator=gen, dtype=dtype)
        y_ref = ref(xf)
        (y_ref * up).sum().backward()
        y = sbn(xr)
        start = sum(p.shape[0] for p in per_rank[:r])
        rows = slice(start, start + xr.shape[0])
        (y * up[rows]).sum().backward()
        close(y, y_ref[rows], f"SyncBatchNorm forward {shape} it {it}", tol)
        close(xr.grad, xf.grad[rows], f"SyncBatchNorm input grad {shape} it {it}", tol)
        close(hvd.allreduce(sbn.weight.grad, op=hvd.Sum), ref.weight.grad, "SyncBN weight grad", tol)
        close(hvd.allreduce(sbn.bias.grad, op=hvd.Sum), ref.bias.grad, "SyncBN bias grad", tol)
        close(sbn.running_mean, ref.running_mean, "SyncBN running_mean", tol)
        close(sbn.running_var, ref.running_var, "SyncBN running_var", tol)
        for m in (ref, sbn):
            m.weight.grad = m.bias.grad = None
    sbn.eval()
    ref.eval()
    close(sbn(per_rank[r]), ref(per_rank[r]), "SyncBN eval", tol)
# channels_last stays channels_last (uncopied), with the same values.
xc = torch.randn(2 + r, 3, 4, 5, dtype=torch.float64)
sbn_cl = hvd.SyncBatchNorm(3, dtype=torch.float64)
y_cl = sbn_cl(xc.to(memory_format=torch.channels_last))
if not y_cl.is_contiguous(memory_format=torch.channels_last):
    fail("SyncBatchNorm of a channels_last input: the output is not channels_last")
close(y_cl, sbn_cl(xc), "SyncBatchNorm channels_last", 1e-12)
# A layer names its two collectives once: from its third step on (the cache
# gives a bit at a name's second sighting), both skip negotiation (response
# cache hits), and a step draws no generated name.
sbn = hvd.SyncBatchNorm(4, dtype=torch.float64)
xs = torch.randn(3 + r, 4, 5, dtype=torch.float64, requires_grad=True)
for _ in range(2):
    sbn(xs).sum().backward()
before = commlib.response_cache_stats()
counters = dict(commlib.runtime._name_counters)
for _ in range(2):
    sbn(xs).sum().backward()
after = commlib.response_cache_stats()
if after["hits"] - before["hits"] < 4 or after["misses"] != before["misses"]:
    fail(f"SyncBatchNorm's repeated steps: cache {before} -> {after}")
if dict(commlib.runtime._name_counters) != counters:
    fail("SyncBatchNorm's repeated steps drew generated names")
# A copy of a layer draws names of its own; the same batch gives the same output.
twin = copy.deepcopy(sbn)
close(twin(xs), sbn(xs), "SyncBatchNorm copy", 1e-12)
# One value per channel over all ranks: every rank raises, and stays in step.
lone = torch.randn(1 if r == 0 else 0, 2, dtype=torch.float64)
expect_raises(ValueError, lambda: hvd.SyncBatchNorm(2, dtype=torch.float64)(lone),
              "SyncBatchNorm of one value", "Expected more than 1 value per channel")
check_equal(hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="after.lone").numpy(),
            np.array([float(n)], np.float32), "allreduce after SyncBatchNorm's error")
# A rank that joined adds zeros: the statistics (and input gradients) are
# those of the other ranks' batches together.
gen = torch.Generator().manual_seed(11)
xs_all = [torch.randn(4 + k, 3, generator=gen, dtype=torch.float64) * 2 + 1 for k in range(n)]
up_all = [torch.randn(4 + k, 3, generator=gen, dtype=torch.float64) for k in range(n)]
if r == n - 1:
    hvd.join()
else:
    xr = xs_all[r].clone().requires_grad_(True)
    xf = torch.cat(xs_all[:n - 1]).requires_grad_(True)
    y_ref = torch.nn.BatchNorm1d(3, dtype=torch.float64)(xf)
    (y_ref * torch.cat(up_all[:n - 1])).sum().backward()
    y = hvd.SyncBatchNorm(3, dtype=torch.float64)(xr)
    (y * up_all[r]).sum().backward()
    start = sum(x.shape[0] for x in xs_all[:r])
    rows = slice(start, start + xr.shape[0])
    close(y, y_ref[rows], "SyncBatchNorm beside a joined rank", 1e-10)
    close(xr.grad, xf.grad[rows], "SyncBatchNorm input grad beside a joined rank", 1e-10)
    hvd.join()
# process_set=: statistics over the set's ranks (0 and the last; at 2 ranks
# the global set, given); the rank between them, at 3 ranks, takes no part.
pair = hvd.add_process_set([0, n - 1]) if n > 2 else hvd.global_process_set
if r in (0, n - 1):
    gen = torch.Generator().manual_seed(13)
    xs_pair = {k: torch.randn(3 + k, 2, 4, generator=gen, dtype=torch.float64) * 2 - 1 for k in (0, n - 1)}
    ups_pair = {k: torch.randn(3 + k, 2, 4, generator=gen, dtype=torch.float64) for k in (0, n - 1)}
    xr = xs_pair[r].clone().requires_grad_(True)
    xf = torch.cat([xs_pair[0], xs_pair[n - 1]]).requires_grad_(True)
    y_ref = torch.nn.BatchNorm1d(2, dtype=torch.float64)(xf)
    (y_ref * torch.cat([ups_pair[0], ups_pair[n - 1]])).sum().backward()
    net = hvd.SyncBatchNorm.convert_sync_batchnorm(
        torch.nn.Sequential(torch.nn.BatchNorm1d(2, dtype=torch.float64)), process_set=pair)
    y = net(xr)
    (y * ups_pair[r]).sum().backward()
    rows = slice(0, 3) if r == 0 else slice(3, 3 + xr.shape[0])
    close(y, y_ref[rows], "SyncBatchNorm over a process set", 1e-10)
    close(xr.grad, xf.grad[rows], "SyncBatchNorm input grad over a process set", 1e-10)
# A layer of the whole job after one of a set that not every rank is in: the
# set's names come from the set's own counters, so all ranks agree on this one.
xs_after = torch.randn(2 + r, 2, dtype=torch.float64)
y_after = hvd.SyncBatchNorm(2, dtype=torch.float64)(xs_after)
everyone = hvd.allgather(xs_after, name="sbn.after.pair")
start = sum(2 + k for k in range(r))  # (this rank's first row of everyone)
close(y_after, torch.nn.functional.batch_norm(everyone, None, None, training=True)[start:start + 2 + r],
      "SyncBatchNorm after a set's", 1e-10)
if n > 2:
    hvd.remove_process_set(pair)
    expect_raises(ValueError, lambda: hvd.SyncBatchNorm(2, process_set=pair)(torch.randn(4, 2)),
                  "SyncBatchNorm over a removed set", "not registered")
conv = hvd.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm1d(3)))
if not isinstance(conv[0], hvd.SyncBatchNorm):
    fail("convert_sync_batchnorm")
done()

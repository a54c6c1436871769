"""Reduce-scatter of an array in pieces (commlib.reducescatter_pieces), ZeRO's
gradient path on it (commlib.torch.sharding.zero_pieces) and the numpy reducescatter
into a caller's buffer (out=), on every rank:

- commlib.reducescatter(out=) writes this rank's part into ``out`` (the
  result is ``out``), equal to the allocating form; bad ``out`` raises.
- reducescatter_pieces, for every dtype and op, with each rank cutting its
  input differently (arrays, counts of zeros, empty pieces), 1-3
  dimensions, scale factors, a process set: bitwise equal to reducescatter
  of the packed array and equal to numpy's reduction of every rank's data;
  bad pieces raise on the calling rank; different shapes across ranks raise
  CollectiveMismatchError on every rank.
- zero_stage=2 trains to parameters bitwise equal to stage 1, including a
  parameter only rank 0 uses (its bucket is ready late there: no hang) and
  gradient accumulation; the shard gradient is the same persistent tensor
  every step; stage 1's p.grad after step() alone is autograd's own.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib
import commlib.torch as hvd
from _common import check_equal, done, expect_raises, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()


def check_numpy_out():
    rows = 2 * n + 1  # uneven: lower ranks get one more row
    x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) * (r + 1)
    want = commlib.reducescatter(x, op=commlib.Sum)
    mine = commlib.ops.reducescatter_rows(rows)
    full = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) * sum(range(1, n + 1))
    start = sum(rows // n + (1 if k < rows % n else 0) for k in range(r))
    check_equal(want, full[start:start + mine], "reducescatter (allocating)")
    out = np.full((mine, 3), -1.0, dtype=np.float32)
    got = commlib.reducescatter(x, op=commlib.Sum, out=out)
    if got is not out:
        fail("reducescatter(out=) should return out itself")
    check_equal(out, want, "reducescatter(out=)")
    h = commlib.reducescatter_async(x * 2, op=commlib.Average, out=out)
    commlib.synchronize(h)
    check_equal(out, full[start:start + mine] * 2 / n, "reducescatter_async(out=), Average")
    for bad, exc, what in [(np.zeros((mine + 1, 3), np.float32), ValueError, "shape"),
                           (np.zeros((mine, 3), np.float64), TypeError, "dtype"),
                           (np.zeros((3, mine), np.float32).T, ValueError, "contiguous"),
                           (x[:mine], ValueError, "overlap")]:
        expect_raises(exc, lambda: commlib.reducescatter(x, out=bad), f"bad out ({what})",
                      match=what if what != "contiguous" else "C-contiguous")
    ro = np.zeros((mine, 3), np.float32)
    ro.flags.writeable = False
    expect_raises(ValueError, lambda: commlib.reducescatter(x, out=ro), "read-only out",
                  match="read-only")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(12, 40)
        self.b = nn.Linear(40, 23)
        self.lonely = nn.Linear(40, 23)  # used by rank 0 only
        self.c = nn.Linear(23, 5)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        y = torch.tanh(self.b(h))
        if r == 0:
            y = y + self.lonely(h)
        return self.c(y)


DTYPES = [np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, "bfloat16"]
OPS = [commlib.Sum, commlib.Average, commlib.Min, commlib.Max, commlib.Product]


def rank_data(k, shape, dtype):
    """Rank k's array (every rank can make every rank's)."""
    rng = np.random.default_rng(100 + k)
    n = int(np.prod(shape))
    if np.dtype(dtype).kind in "iu":
        return rng.integers(1, 5, n).astype(dtype).reshape(shape)
    return (rng.standard_normal(n) * 2).astype(np.float32).astype(dtype).reshape(shape)


def cut(arr, k):
    """Rank k's pieces of ``arr``: arrays and runs of zeros, cut at random points."""
    flat = arr.reshape(-1)
    rng = np.random.default_rng(7 + k)
    points = sorted(set(rng.integers(0, flat.size + 1, 4).tolist()) | {0, flat.size})
    pieces = []
    for a, b in zip(points, points[1:]):
        part = flat[a:b]
        if part.size and not part.astype(np.float64).any():
            pieces.append(int(part.size))
        else:
            pieces.append(np.ascontiguousarray(part))
        pieces.append(np.empty(0, flat.dtype))  # empty pieces are allowed
    return pieces


def numpy_reduce(arrays, op):
    wide = [a.astype(np.float64) for a in arrays]
    if op in (commlib.Sum, commlib.Average):
        out = np.sum(wide, axis=0)
        return out / len(arrays) if op == commlib.Average else out
    if op == commlib.Min:
        return np.min(wide, axis=0)
    if op == commlib.Max:
        return np.max(wide, axis=0)
    return np.prod(wide, axis=0)


def check_pieces(process_set=None):
    members = list(range(n)) if process_set is None else process_set.ranks
    if r not in members:
        return
    pos, size = members.index(r), len(members)
    import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy (torch needs it too)
    for dtype in DTYPES:
        dt = np.dtype(dtype)
        for op in OPS:
            if op == commlib.Average and dt.kind in "iu":
                continue
            for shape in [(size * 5 + 1,), (size + 1, 3), (2 * size, 2, 3)]:
                mine = rank_data(r, shape, dt)
                # zero runs of a few elements, so that counts stand in for them
                mine.reshape(-1)[2:5] = 0
                want = commlib.reducescatter(mine, op=op, process_set=process_set)
                got = commlib.reducescatter_pieces(cut(mine, r), shape, dt, op=op,
                                                   process_set=process_set)
                what = f"reducescatter_pieces {dt} op {op} shape {shape}"
                check_equal(got, want, what + " vs reducescatter")
                everyone = []
                for k in members:
                    a = rank_data(k, shape, dt)
                    a.reshape(-1)[2:5] = 0
                    everyone.append(a)
                rows = [commlib.ops.reducescatter_rows(shape[0], process_set)]
                start = sum(shape[0] // size + (1 if j < shape[0] % size else 0)
                            for j in range(pos))
                ref = numpy_reduce(everyone, op)[start:start + rows[0]]
                tol = {"float16": 2e-2, "bfloat16": 5e-2}.get(dt.name, 1e-5)
                if op == commlib.Product and dt.kind in "iu":
                    ref = ref.astype(dt).astype(np.float64)  # wraps as the core's does
                check_equal(got.astype(np.float64), ref, what + " vs numpy", rtol=tol, atol=tol)
    x = rank_data(r, (size, 4), np.float32)
    out = np.full((1, 4), -1.0, np.float32)
    got = commlib.reducescatter_pieces([x[:1].ravel().copy(), 4 * size - 4], (size, 4), np.float32,
                                       op=commlib.Sum, prescale_factor=2.0, postscale_factor=0.25,
                                       out=out, process_set=process_set)
    if got is not out:
        fail("reducescatter_pieces(out=) should return out itself")
    y = x.copy()
    y[1:] = 0
    check_equal(out, commlib.reducescatter(y, op=commlib.Sum, prescale_factor=2.0,
                                           postscale_factor=0.25, process_set=process_set),
                "reducescatter_pieces with scale factors")


def check_piece_errors():
    a = np.ones(4, np.float32)
    for pieces, exc, match in [([a, 3], ValueError, "hold 7 elements"),
                               ([a.astype(np.float64), 4], TypeError, "dtype"),
                               ([np.ones(8, np.float32)[::2], 4], ValueError, "C-contiguous"),
                               ([a, -4, 8], ValueError, ">= 0"),
                               ([a, "4"], TypeError, "numpy array or an int"),
                               (a, TypeError, "list of arrays")]:
        expect_raises(exc, lambda: commlib.reducescatter_pieces(pieces, (n, 4), np.float32),
                      f"bad pieces ({match})", match=match)
    buf = np.zeros(8 * n, np.float32)
    expect_raises(ValueError, lambda: commlib.reducescatter_pieces(
        [buf[:4 * n]], (n, 4), np.float32, out=buf[4:8].reshape(1, 4)),
        "out overlapping a piece", match="overlap")
    expect_raises(ValueError, lambda: commlib.reducescatter_pieces(
        [buf[:4 * n]], (n, 4), np.float32, out=np.zeros((1, 5), np.float32)),
        "out of the wrong shape", match="shape")
    # a shape that differs across ranks: every rank hears of it
    shape = (n, 4 + r)
    expect_raises(commlib.CollectiveMismatchError, lambda: commlib.reducescatter_pieces(
        [int(np.prod(shape))], shape, np.float32, name="rs.mismatch"),
        "shapes differing across ranks", match="rs.mismatch")


def train(stage, passes=1, steps=6):
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2),
                                   named_parameters=model.named_parameters(),
                                   zero_stage=stage, bucket_elements=700,
                                   backward_passes_per_step=passes)
    shard_grads = None
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):
            g = torch.Generator().manual_seed(1000 * step + 10 * k + r)
            x, y = torch.randn(7, 12, generator=g), torch.randint(0, 5, (7,), generator=g)
            F.cross_entropy(model(x), y).backward()
        local = [p.grad for p in model.parameters()]
        opt.step()
        if stage == 1 and passes == 1 and step == 0:
            after = [p.grad for p in model.parameters()]
            if any(a is not b for a, b in zip(after, local)):
                fail("stage 1: step() alone should leave autograd's own gradients in p.grad")
        if stage == 2:
            now = [b.shard.grad for b in opt._buckets]
            if any(g is not b.grad_shard for g, b in zip(now, opt._buckets)):
                fail("stage 2: the shard gradient should be the persistent grad_shard")
            if shard_grads is not None and [g.data_ptr() for g in now] != shard_grads:
                fail("stage 2: the shard gradient buffers moved between steps")
            shard_grads = [g.data_ptr() for g in now]
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), opt


def check_training():
    for passes in (1, 2):
        ref, opt1 = train(1, passes=passes)
        if len(opt1._buckets) < 3:
            fail(f"expected several buckets, got {len(opt1._buckets)}")
        got, _ = train(2, passes)
        check_equal(got.numpy(), ref.numpy(), f"stage 2 (passes={passes}) vs stage 1")


check_numpy_out()
check_pieces()
if n > 2:
    check_pieces(hvd.add_process_set([0, 2]))
check_piece_errors()
check_training()
done()

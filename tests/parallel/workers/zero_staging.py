"""Stage 2's staged reduce-scatter (commlib.torch.zero_staging) and the numpy
reducescatter into a caller's buffer (out=), on every rank:

- commlib.reducescatter(out=) writes this rank's part into ``out`` (the
  result is ``out``), equal to the allocating form; bad ``out`` raises.
- zero_stage=2 with staging slots far smaller than a bucket (many column
  slices, uneven last slice, padding) trains to parameters bitwise equal to
  the default staging and to stage 1 (one whole-bucket reduce-scatter),
  including a parameter only rank 0 uses (its bucket is ready late there:
  no hang) and gradient accumulation; the shard gradient is the same
  persistent tensor every step; staging_bytes must agree across ranks.
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


def train(stage, staging_bytes=None, passes=1, steps=6):
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2),
                                   named_parameters=model.named_parameters(),
                                   zero_stage=stage, bucket_elements=700,
                                   staging_bytes=staging_bytes,
                                   backward_passes_per_step=passes)
    shard_grads = None
    for step in range(steps):
        opt.zero_grad()
        for k in range(passes):
            g = torch.Generator().manual_seed(1000 * step + 10 * k + r)
            x, y = torch.randn(7, 12, generator=g), torch.randint(0, 5, (7,), generator=g)
            F.cross_entropy(model(x), y).backward()
        opt.step()
        if stage == 2:
            now = [b.shard.grad for b in opt._buckets]
            if any(g is not b.grad_shard for g, b in zip(now, opt._buckets)):
                fail("stage 2: the shard gradient should be the persistent grad_shard")
            if shard_grads is not None and [g.data_ptr() for g in now] != shard_grads:
                fail("stage 2: the shard gradient buffers moved between steps")
            shard_grads = [g.data_ptr() for g in now]
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]), opt


def check_staged_training():
    for passes in (1, 2):
        ref, opt1 = train(1, passes=passes)
        if len(opt1._buckets) < 3:
            fail(f"expected several buckets, got {len(opt1._buckets)}")
        for staging in (None, 64, 100, 4 * 24 * n):  # 64 bytes: 16 floats, over n rows
            got, _ = train(2, staging, passes)
            check_equal(got.numpy(), ref.numpy(),
                        f"stage 2 (staging_bytes={staging}, passes={passes}) vs stage 1")


def check_errors():
    for bad in (0, -1, 2.5, True, "4M"):
        expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(Net().parameters(), lr=0.1), zero_stage=2, staging_bytes=bad),
            f"staging_bytes={bad!r}", match="staging_bytes")
    model = Net()
    expect_raises(hvd.CollectiveMismatchError, lambda: hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        zero_stage=2, staging_bytes=1024 * (r + 1)), "staging_bytes differing across ranks")


check_numpy_out()
check_staged_training()
check_errors()
done()

"""The submission fast path (commlib.submit: facts of an array cached by its
identity; commlib.torch describing a tensor without a numpy view) must see
every change a live array or tensor can go through between two in-place
allreduces: a new shape, a new dtype, made read-only or non-contiguous, a
new storage behind a torch tensor, a dead array whose id is reused. Each
result is checked against numpy on every rank."""
import numpy as np
import torch

import commlib
import commlib.torch as hvd
from _common import check_equal, done, expect_raises

torch.set_num_threads(1)
hvd.init()
r, n = commlib.rank(), commlib.size()
total = sum(range(1, n + 1))  # sum over ranks of (rank + 1)


def reduced(arr, name):
    commlib.synchronize(commlib.allreduce_async_(arr, op=commlib.Sum, name=name))
    return arr


# numpy: the same array again and again, then changed in place
a = np.full(12, r + 1, np.float32)
for i in range(3):
    a[:] = r + 1
    check_equal(reduced(a, "np.same"), np.full(12, total, np.float32), f"numpy repeat {i}")
a[:] = r + 1
a.shape = (3, 4)  # reshaped in place: another shape, the same data
check_equal(reduced(a, "np.reshaped"), np.full((3, 4), total, np.float32), "numpy reshaped in place")
a.dtype = np.int32  # reinterpreted in place: the core must reduce int32 now
a[:] = r + 1
check_equal(reduced(a, "np.retyped"), np.full((3, 4), total, np.int32), "numpy retyped in place")
a.flags.writeable = False
expect_raises(ValueError, lambda: commlib.allreduce_async_(a, name="np.ro"), "read-only array",
              match="read-only")
b = np.full(16, r + 1, np.float64)
reduced(b, "np.strided.0")
view = b[::2]  # a non-contiguous view is another object; the original stays fine
expect_raises(ValueError, lambda: commlib.allreduce_async_(view, name="np.nc"), "strided view",
              match="C-contiguous")
b[:] = r + 1
check_equal(reduced(b, "np.strided.1"), np.full(16, total, np.float64), "numpy after a view")
for i in range(50):  # arrays die and their ids are reused by new ones elsewhere in memory
    c = np.full(64 + i, (r + 1) * (i + 1), np.float32)
    check_equal(reduced(c, f"np.fresh.{i}"), np.full(64 + i, total * (i + 1), np.float32),
                f"fresh array {i}")
    del c

# torch: in place, the same tensor and its changes
t = torch.full((8,), float(r + 1))
for i in range(3):
    t.fill_(r + 1)
    hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Sum, name="t.same"))
    check_equal(t.numpy(), np.full(8, total, np.float32), f"torch repeat {i}")
t.data = torch.full((5,), float(10 * (r + 1)), dtype=torch.float64)  # a new storage
out = hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Sum, name="t.newdata"))
if out is not t:
    raise SystemExit(f"rank {r}: synchronize of allreduce_async_ must return the tensor itself")
check_equal(t.numpy(), np.full(5, 10 * total, np.float64), "torch after tensor.data = ...")
u = torch.full((3,), float(r + 1), dtype=torch.float64)
hvd.allreduce_(u, op=hvd.Sum, name="t.before_resize")
u.resize_(40, 30)  # a larger storage: the data moves
u.fill_(r + 1)
hvd.allreduce_(u, op=hvd.Average, name="t.resized")
check_equal(u.clone().numpy(), np.full((40, 30), total / n, np.float64), "torch after resize_")
s = torch.tensor(float(r + 1))  # 0-d
hvd.allreduce_(s, op=hvd.Sum, name="t.scalar")
check_equal(s.numpy(), np.array(total, np.float32), "torch 0-d in place")
bf = torch.full((4,), float(r + 1), dtype=torch.bfloat16)
hvd.allreduce_(bf, op=hvd.Sum, name="t.bf16")
check_equal(bf.float().numpy(), np.full(4, total, np.float32), "torch bfloat16 in place")
m = torch.full((4, 4), float(r + 1)).t()  # not contiguous
expect_raises(ValueError, lambda: hvd.allreduce_async_(m, name="t.nc"), "non-contiguous tensor",
              match="contiguous")
expect_raises(TypeError, lambda: hvd.allreduce_async_(np.ones(3), name="t.np"), "numpy to torch",
              match="torch.Tensor")
expect_raises(TypeError, lambda: hvd.allreduce_async_(torch.ones(3, dtype=torch.complex64),
                                                      name="t.cplx"),
              "unsupported dtype", match="unsupported dtype")
w = torch.full((6,), float(r + 1))
hvd.allreduce_(w, op=hvd.Sum, name="t.retype.0")
w.data = w.view(torch.int32)  # the same memory, address and shape: another dtype
w.fill_(r + 1)
hvd.allreduce_(w, op=hvd.Sum, name="t.retype.1")
check_equal(w.numpy(), np.full(6, total, np.int32), "torch retyped over the same memory")
w.data = torch.full((6,), float(r + 1))
for op, want in ((hvd.Sum, total), (hvd.Average, total / n), (hvd.Sum, total)):  # (new, changed, changed)
    w.fill_(r + 1)
    hvd.allreduce_(w, op=op, name="t.ops", prescale_factor=2.0)
    check_equal(w.numpy(), np.full(6, 2 * want, np.float32), f"torch op {op} with a prescale")

# torch grouped: the layout of a list of tensors is cached, and sees their changes
g = [torch.full((16,), float(r + 1)) for _ in range(4)] + [torch.full((2, 3), float(r + 1), dtype=torch.float64)]
for i in range(3):
    outs = hvd.grouped_allreduce(g, op=hvd.Sum, name="g.oop")
    for k, (o, x) in enumerate(zip(outs, g)):
        check_equal(o.numpy(), np.full(tuple(x.shape), total, x.numpy().dtype), f"grouped out of place {i}.{k}")
        check_equal(x.numpy(), np.full(tuple(x.shape), r + 1, x.numpy().dtype), f"grouped input kept {i}.{k}")
uniform = [torch.full((16,), float(r + 1)) for _ in range(3)]
outs = hvd.grouped_allreduce(uniform, op=hvd.Sum, name="g.uniform")
outs[0].fill_(-1)  # results are tensors of their own shape, apart from one another's data
check_equal(outs[1].numpy(), np.full(16, total, np.float32), "uniform grouped results apart")
if tuple(outs[2].shape) != (16,):
    raise SystemExit(f"rank {r}: a uniform group's result has shape {tuple(outs[2].shape)}")
for i in range(2):
    for x in g:
        x.fill_(r + 1)
    hvd.grouped_allreduce_(g, op=hvd.Sum, name="g.inplace")
    check_equal(g[4].numpy(), np.full((2, 3), total, np.float64), f"grouped in place {i}")
g[1].data = torch.full((7,), float(r + 1), dtype=torch.float64)  # a new storage, shape and dtype
g[4].data = torch.empty((50, 40), dtype=torch.float64)  # the data moves
for x in g:
    x.fill_(r + 1)
hvd.grouped_allreduce_(g, op=hvd.Average, name="g.changed")
for k, x in enumerate(g):
    check_equal(x.numpy(), np.full(tuple(x.shape), total / n, x.numpy().dtype), f"grouped after changes {k}")
done()

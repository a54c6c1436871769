"""The submission fast path (commlib.submit: facts of an array cached by its
identity; commlib.torch describing a tensor without a numpy view) must see
every change a live array or tensor can go through between two in-place
allreduces: a new shape, a new dtype, made read-only or non-contiguous, a
new storage behind a torch tensor, a dead array whose id is reused; torch's
out-of-place allreduce (each result a new tensor, none overwritten by a
repeated call's) and the differentiable collectives with and without a graph
to record. Each result is checked against numpy on every rank."""
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

# torch out of place: the input's facts cached, each result a new tensor of its own
o = torch.full((3, 4), float(r + 1))
firsts = []
for i in range(3):
    o.fill_(r + 1 + i)  # (in place: the same tensor every time)
    firsts.append(hvd.allreduce(o, op=hvd.Sum, name="t.oop"))
    if i % 2:  # in place under the same name and tensor between two out-of-place calls
        hvd.allreduce_(o, op=hvd.Sum, name="t.oop")
        check_equal(o.numpy(), np.full((3, 4), total + n * i, np.float32), f"torch in place between {i}")
for i, res in enumerate(firsts):  # (no result overwritten by a later call's)
    check_equal(res.numpy(), np.full((3, 4), total + n * i, np.float32), f"torch out of place {i}")
    if res.data_ptr() == o.data_ptr() or tuple(res.shape) != (3, 4):
        raise SystemExit(f"rank {r}: out-of-place result {i} is not a new (3, 4) tensor")
hs = [hvd.allreduce_async(o, op=hvd.Max, name="t.oop")]  # (the name of the calls above)
hs += [hvd.allreduce_async(o, op=hvd.Max, name=f"t.oop.async.{k}") for k in range(2)]
res = [hvd.synchronize(h) for h in hs]  # (o holds r + 3: the last fill above)
for k, x in enumerate(res):
    check_equal(x.numpy(), np.full((3, 4), n + 2, np.float32), f"torch out of place async {k}")
if len({x.data_ptr() for x in res}) != 3:
    raise SystemExit(f"rank {r}: asynchronous out-of-place results share memory")
o.data = torch.full((2,), float(r + 1), dtype=torch.float64)  # a new storage, shape and dtype
check_equal(hvd.allreduce(o, op=hvd.Sum, name="t.oop").numpy(), np.full(2, total, np.float64),
            "torch out of place after tensor.data = ...")
m2 = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (r + 1)  # not contiguous
check_equal(hvd.allreduce(m2, op=hvd.Sum, name="t.oop.strided").numpy(),
            np.arange(12, dtype=np.float32).reshape(3, 4).T * total, "torch out of place, not contiguous")
check_equal(hvd.allreduce(torch.tensor(float(r + 1)), name="t.oop.0d").numpy(),
            np.array(total / n, np.float32), "torch out of place 0-d")
check_equal(hvd.allreduce(torch.empty((0, 3)), name="t.oop.empty").numpy(), np.empty((0, 3), np.float32),
            "torch out of place, empty")
for shape in [(), (2, 3)]:  # (a 0-d tensor travels as 1-element 1-d: its result is 0-d again)
    b = hvd.broadcast(torch.full(shape, float(r + 1), dtype=torch.bfloat16), 0, name=f"t.bcast.{len(shape)}")
    if tuple(b.shape) != shape or b.dtype != torch.bfloat16:
        raise SystemExit(f"rank {r}: broadcast of a {shape} bfloat16 tensor gave {tuple(b.shape)} {b.dtype}")
    check_equal(b.float().numpy(), np.ones(shape, np.float32), f"torch broadcast {shape}")
bt = torch.empty(5)
for i, root in enumerate([0, 0, n - 1, 0]):  # in place, one name: the root changes under it
    bt.fill_(10 * r + i)
    hvd.broadcast_(bt, root, name="t.bcast_")
    check_equal(bt.numpy(), np.full(5, 10 * root + i, np.float32), f"torch broadcast_ {i} from {root}")
bt.data = torch.full((2, 2), float(r), dtype=torch.float64)  # a new storage, shape and dtype
check_equal(hvd.broadcast_(bt, n - 1, name="t.bcast_").numpy(), np.full((2, 2), n - 1.0), "torch broadcast_ after .data")
expect_raises(ValueError, lambda: hvd.broadcast_(torch.ones(4, 2).t(), 0, name="t.bcast_.strided"),
              "a strided broadcast_", match="contiguous")
expect_raises(TypeError, lambda: hvd.allreduce(np.ones(3), name="t.oop.np"), "numpy to torch allreduce",
              match="torch.Tensor")

# the differentiable collectives record a graph only where autograd would
# (their autograd function skipped otherwise): same results either way
leaf = torch.full((n, 2), float(r + 1), requires_grad=True)
calls = {"allreduce": (lambda t: hvd.allreduce(t, op=hvd.Sum), np.full((n, 2), total)),
         "broadcast": (lambda t: hvd.broadcast(t, 0), np.full((n, 2), 1.0)),
         "allgather": (lambda t: hvd.allgather(t), np.repeat(np.arange(1.0, n + 1), 2 * n).reshape(n * n, 2)),
         "alltoall": (lambda t: hvd.alltoall(t), np.repeat(np.arange(1.0, n + 1), 2).reshape(n, 2)),
         "reducescatter": (lambda t: hvd.reducescatter(t, op=hvd.Sum), np.full((1, 2), total)),
         "grouped_allgather": (lambda t: hvd.grouped_allgather([t])[0],
                               np.repeat(np.arange(1.0, n + 1), 2 * n).reshape(n * n, 2)),
         "grouped_reducescatter": (lambda t: hvd.grouped_reducescatter([t], op=hvd.Sum)[0],
                                   np.full((1, 2), total))}
for what, (call, want) in calls.items():
    for grad_mode in (False, True):
        with torch.set_grad_enabled(grad_mode):
            for t in (leaf, leaf.detach()):
                out = call(t)
                check_equal(out.detach().numpy(), want.astype(np.float32), f"{what}, grad mode {grad_mode}")
                if out.requires_grad != (grad_mode and t.requires_grad):
                    raise SystemExit(f"rank {r}: {what} (grad mode {grad_mode}, input requires grad "
                                     f"{t.requires_grad}) gave requires_grad={out.requires_grad}")

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

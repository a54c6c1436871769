"""commlib.torch.send/recv/isend/irecv/sendrecv on every rank: dtypes,
shapes (0-d, empty, non-contiguous, changing from message to message),
out=, autograd pairs (2-rank pair, 3-rank chain, differentiable ring) checked
against gradients computed in one process, and the error paths."""
import numpy as np
import torch

import commlib.torch as hvd
from _common import check_equal, done, expect_raises, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
right, left = (r + 1) % n, (r - 1) % n


def payload(src, i, dtype, shape):
    g = torch.Generator().manual_seed(100 * src + i)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 10).to(dtype)


CASES = [(torch.float32, (3, 4)), (torch.float64, ()), (torch.int64, (0, 5)),
         (torch.bfloat16, (7,)), (torch.float16, (2, 3, 2)), (torch.int32, (40000,)),
         (torch.uint8, (5, 1))]


def check_tensor(got, want, what):
    if not isinstance(got, torch.Tensor):
        fail(f"{what}: got {type(got).__name__}, not a tensor")
    if got.dtype != want.dtype or got.shape != want.shape:
        fail(f"{what}: got {got.dtype}{tuple(got.shape)} expected {want.dtype}{tuple(want.shape)}")
    if not torch.equal(got, want):
        fail(f"{what}: values differ: {got.reshape(-1)[:6]} vs {want.reshape(-1)[:6]}")


# ---- dtypes and shapes around a ring: blocking send after irecv is posted
for i, (dtype, shape) in enumerate(CASES):
    h = hvd.irecv(src=left, tag=i)
    hvd.send(payload(r, i, dtype, shape), dst=right, tag=i)
    check_tensor(hvd.synchronize(h), payload(left, i, dtype, shape), f"ring {dtype}{shape}")

# ---- the short path (blocking send of, and blocking recv into, a plain contiguous tensor):
# views at a storage offset, every dtype; nothing outside the view is written
for i, (dtype, shape) in enumerate(CASES):
    src = torch.stack([payload(r, 80 + i, dtype, shape)] * 3)
    src[0].zero_()
    h = hvd.irecv(src=left, tag=80 + i)
    hvd.send(src[1], dst=right, tag=80 + i)
    check_tensor(hvd.synchronize(h), payload(left, 80 + i, dtype, shape), f"send of a view {dtype}{shape}")
    big = torch.zeros((3,) + shape, dtype=dtype)
    hs = hvd.isend(payload(r, 90 + i, dtype, shape), dst=right, tag=90 + i)
    if hvd.recv(src=left, tag=90 + i, out=big[1]).data_ptr() != big[1].data_ptr():
        fail("recv(out=) must return out")
    check_tensor(big[1], payload(left, 90 + i, dtype, shape), f"recv into a view {dtype}{shape}")
    check_tensor(big[0], torch.zeros(shape, dtype=dtype), f"recv wrote before its view {dtype}{shape}")
    check_tensor(big[2], torch.zeros(shape, dtype=dtype), f"recv wrote after its view {dtype}{shape}")
    hvd.synchronize(hs)

# ---- non-contiguous input, out= buffers, isend handles, shapes that change per message
x = payload(r, 50, torch.float32, (6, 4)).t()
out = torch.empty(4, 6)
hr = hvd.irecv(src=left, tag=50, out=out)
hs = hvd.isend(x, dst=right, tag=50)
if hvd.synchronize(hr) is not out:
    fail("irecv(out=) must return out")
check_tensor(out, payload(left, 50, torch.float32, (6, 4)).t().contiguous(), "non-contiguous")
if hvd.synchronize(hs) is not None:
    fail("isend's synchronize must return None")
for k in range(4):  # one tag, four shapes: received in order, each with its own shape
    hs = hvd.isend(payload(r, 60 + k, torch.float32, (k + 1, 3 - k % 2)), dst=right, tag=60)
    check_tensor(hvd.recv(src=left, tag=60), payload(left, 60 + k, torch.float32, (k + 1, 3 - k % 2)),
                 f"variable shape {k}")
    hvd.synchronize(hs)
y = hvd.sendrecv(payload(r, 70, torch.float64, (3,)), dst=right, src=left, send_tag=70,
                 recv_tag=70)
check_tensor(y, payload(left, 70, torch.float64, (3,)), "sendrecv")


# ---- autograd: every rank computes the single-process reference itself
def weights(k):
    return payload(k, 200, torch.float64, (4, 4)) / 10


def data():
    return payload(0, 300, torch.float64, (5, 4))


def reference_chain():
    """x -> tanh(x W0) -> tanh(. W1) -> ... on ranks 0..n-1; loss = sum(out^2)."""
    ws = [weights(k).requires_grad_() for k in range(n)]
    h = data()
    for w in ws:
        h = torch.tanh(h @ w)
    (h ** 2).sum().backward()
    return [w.grad for w in ws]


ref = reference_chain()
w = weights(r).requires_grad_()
h = data() if r == 0 else hvd.recv(src=r - 1, tag=7, requires_grad=True)
if r > 0 and not h.requires_grad:
    fail("recv(requires_grad=True) must return a tensor that requires grad")
out = torch.tanh(h @ w)
if r < n - 1:
    token = hvd.send(out, dst=r + 1, tag=7)
    if token.shape != () or float(token.detach()) != 0.0 or not token.requires_grad:
        fail(f"send token: {token!r}")
    token.backward()
else:
    (out ** 2).sum().backward()
check_equal(w.grad.numpy(), ref[r].numpy(), "chain gradient", rtol=1e-12, atol=1e-12)

# differentiable ring: rank r sends x_r * w_r to its right, loss_r = sum(y_r * c_r)
def c(k):
    return payload(k, 400, torch.float64, (6,))


w = payload(r, 401, torch.float64, (6,)).requires_grad_()
y = hvd.sendrecv(payload(r, 402, torch.float64, (6,)) * w, dst=right, src=left, send_tag=3,
                 recv_tag=3)
(y * c(r)).sum().backward()
check_equal(w.grad.numpy(), (payload(r, 402, torch.float64, (6,)) * c(right)).numpy(),
            "sendrecv gradient", rtol=1e-12)
# no grad: a plain send returns a token without a graph
with torch.no_grad():
    hr = hvd.irecv(src=left, tag=10)
    tok = hvd.send(torch.ones(2, requires_grad=True), dst=right, tag=10)
    hvd.synchronize(hr)
if tok.requires_grad:
    fail("send under no_grad must not build a graph")

# ---- errors, raised before anything is sent
expect_raises(ValueError, lambda: hvd.send(torch.ones(2, requires_grad=True), dst=right,
                                           tag=2**62), "gradient tag range", "2**62")
expect_raises(ValueError, lambda: hvd.recv(src=left, out=torch.empty(2), requires_grad=True),
              "out with requires_grad", "out=None")
expect_raises(TypeError, lambda: hvd.send(np.ones(2), dst=right), "numpy into torch send",
              "torch.Tensor")
expect_raises(ValueError, lambda: hvd.send(torch.ones(2), dst=n), "dst outside", "outside")
expect_raises(TypeError, lambda: hvd.isend(torch.ones(2, dtype=torch.complex64), dst=right),
              "complex dtype", "unsupported dtype")
expect_raises(ValueError, lambda: hvd.irecv(src=left, out=torch.empty(4, 4).t()),
              "non-contiguous out", "contiguous")
if hvd.gradient_tag(5) != 5 + 2**62:
    fail("gradient_tag")
hvd.barrier()
done()

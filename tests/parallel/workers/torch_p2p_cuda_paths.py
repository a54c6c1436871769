"""commlib.torch's point-to-point on CUDA tensors, on CPU-only ranks: the
steps CUDA tensors take run here on CPU tensors, and must give the direct
path's results: every dtype, unknown shapes, out=, isend/irecv, sendrecv, the
autograd pairs, and the errors. A ring: rank r sends to r+1 and receives
from r-1.

argv[1]:
- staged: the host-staging steps (frontends/torch/p2p.py: a send copies the
  tensor to a pinned host tensor, a receive into a device `out` lands in a
  host buffer and is copied in, `device=` moves a new tensor), for every tensor;
- nccl (run against the GPU emulator): the NCCL steps (frontends/torch/
  cuda_p2p.py: every send hands the core "device" memory, every receive
  takes device messages: an `out` of even size stands for a CUDA tensor and
  the message lands in it, one of odd size for a host tensor and the message
  lands in the core's "device" memory and is copied over, as for a new
  tensor), with the emulator's NCCL moving the data; plus host messages from
  the numpy API into those receives.
"""
import ctypes
import os
import sys

import numpy as np
import torch

import commlib
import commlib.torch as hvd
from commlib import device_p2p
from commlib.torch.collectives import p2p
from commlib.torch.cuda import cuda_p2p
from _common import done, expect_raises, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
right, left = (r + 1) % n, (r - 1) % n

# Stage every tensor, and count the staging steps taken.
counts = {"stage_in": 0, "host_buffer": 0}
_stage_in, _host_buffer = p2p.stage_in, p2p.host_buffer


def counting(name, fn):
    def run(*args, **kwargs):
        counts[name] += 1
        return fn(*args, **kwargs)
    return run


mode = sys.argv[1]
if mode == "staged":
    p2p._staged = lambda t: True
    p2p.stage_in = counting("stage_in", _stage_in)
    p2p.host_buffer = counting("host_buffer", _host_buffer)
else:  # every tensor stands for a CUDA tensor on device 0, its stream the emulator's stream 0
    counts = {"isend_device": 0, "irecv_device": 0, "release": 0}
    emulator = ctypes.CDLL(os.environ["COMMLIB_NCCL_LIBRARY"])
    cuda_p2p.is_nccl_tensor = lambda t: isinstance(t, torch.Tensor)
    cuda_p2p.takes_device_messages = lambda: True
    cuda_p2p.is_device_out = lambda t: t.numel() % 2 == 0
    cuda_p2p.device_index = lambda device: 0
    cuda_p2p.stream_of = lambda device: 0
    cuda_p2p.receive_device = lambda out, device: torch.device("cpu")
    # (a CUDA tensor's host read waits for its stream; the emulator's stream 0 is waited for here)
    cuda_p2p.copied = lambda device: emulator.cudaStreamSynchronize(ctypes.c_void_p(0))
    for name in counts:
        setattr(device_p2p, name, counting(name, getattr(device_p2p, name)))


def same(got, want, what):
    if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or got.shape != want.shape:
        fail(f"{what}: got {got!r} want {want!r}")
    if not torch.equal(got, want):
        fail(f"{what}: got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()}")


def payload(rank, dtype, salt):
    """Rank `rank`'s message: its own shape (unknown to the receiver)."""
    shape = (rank + 1, 3) if salt % 2 else (2 + rank,)
    x = (torch.arange(int(torch.tensor(shape).prod())) * (salt + 1) + rank) % 100
    return x.reshape(shape).to(dtype)


DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.uint8, torch.int8, torch.bool)
for salt, dtype in enumerate(DTYPES):
    mine, theirs = payload(r, dtype, salt), payload(left, dtype, salt)
    tag = 100 + salt
    # blocking, a new tensor (also put on a device: here the CPU)
    h = hvd.isend(mine, right, tag=tag)
    same(hvd.recv(left, tag=tag), theirs, f"recv {dtype}")
    hvd.synchronize(h)
    h = hvd.isend(mine, right, tag=tag)
    same(hvd.recv(left, tag=tag, device="cpu"), theirs, f"recv {dtype} device=cpu")
    hvd.synchronize(h)
    # into out: the result lands in a host buffer, then in out, which is returned
    out = torch.zeros_like(theirs)
    h = hvd.isend(mine, right, tag=tag)
    got = hvd.recv(left, tag=tag, out=out)
    hvd.synchronize(h)
    if got is not out:
        fail(f"recv {dtype} into out did not return out")
    same(out, theirs, f"recv {dtype} into out")
    # irecv both ways
    hr = hvd.irecv(left, tag=tag, out=torch.zeros_like(theirs))
    hr2 = hvd.irecv(left, tag=tag + 1000)
    hs = hvd.isend(mine, right, tag=tag)
    hs2 = hvd.isend(mine, right, tag=tag + 1000)
    same(hvd.synchronize(hr), theirs, f"irecv {dtype} into out")
    same(hvd.synchronize(hr2), theirs, f"irecv {dtype}")
    for h in (hs, hs2):
        if hvd.synchronize(h) is not None:
            fail("isend's synchronize returns None")
    # sendrecv, new tensor and into out
    same(hvd.sendrecv(mine, right, left, send_tag=tag, recv_tag=tag), theirs, f"sendrecv {dtype}")
    out = torch.zeros_like(theirs)
    same(hvd.sendrecv(mine, right, left, send_tag=tag, recv_tag=tag, out=out), theirs,
         f"sendrecv {dtype} into out")
    same(out, theirs, f"sendrecv {dtype}: out")

# A message sent from a non-contiguous tensor arrives whole.
t = torch.arange(12.0).reshape(3, 4).t() + r
h = hvd.isend(t, right, tag=7)
same(hvd.recv(left, tag=7), torch.arange(12.0).reshape(3, 4).t() + left, "non-contiguous send")
hvd.synchronize(h)

# Autograd: rank 0 sends 2x to rank 1, which receives it differentiably and
# sends back d(3h)/dh = 3: x.grad = 6 on rank 0.
if r == 0:
    x = torch.ones(4, requires_grad=True)
    token = hvd.send(x * 2, dst=1, tag=11)
    token.backward()
    same(x.grad, torch.full((4,), 6.0), "x.grad through send/recv")
elif r == 1:
    h = hvd.recv(0, tag=11, requires_grad=True, device="cpu")
    same(h.detach(), torch.full((4,), 2.0), "differentiable recv")
    (h * 3).sum().backward()
# sendrecv backward: every rank sends y = x * (r + 1) right; the loss is
# sum(received * 10), so x's gradient comes back from the right: 10 * (r + 1).
x = torch.ones(3, requires_grad=True)
got = hvd.sendrecv(x * (r + 1), right, left, send_tag=12, recv_tag=12)
same(got.detach(), torch.full((3,), float(left + 1)), "differentiable sendrecv")
(got * 10).sum().backward()
same(x.grad, torch.full((3,), 10.0 * (r + 1)), "x.grad through sendrecv")

if mode == "nccl":
    # Host messages (the numpy API) into receives that may claim device messages.
    h = commlib.isend(np.arange(5.0) + r, right, tag=30)
    same(hvd.recv(left, tag=30), torch.arange(5.0, dtype=torch.float64) + left, "a host message")
    commlib.synchronize(h)
    h = commlib.isend(np.arange(5.0) + r, right, tag=31)
    out = torch.zeros(5, dtype=torch.float64)
    same(hvd.synchronize(hvd.irecv(left, tag=31, out=out)), torch.arange(5.0, dtype=torch.float64) + left,
         "a host message into out")
    commlib.synchronize(h)
if 0 in counts.values():
    fail(f"the {mode} steps did not run: {counts}")

# Errors: an out of the wrong size fails the receive (naming both) and the send
# (naming the receiver); out= with device=; a device commlib cannot reach.
if n >= 2:
    if r == 0:
        e = expect_raises(ValueError, lambda: hvd.send(torch.ones(5), 1, tag=21), "send into a wrong out")
        if "rank 1" not in str(e):
            fail(f"the sender's error does not name the receiver: {e}")
    elif r == 1:
        expect_raises(ValueError, lambda: hvd.recv(0, tag=21, out=torch.zeros(4)), "recv into a wrong out",
                      match="float32 [5]")
expect_raises(ValueError, lambda: hvd.recv(left, tag=22, out=torch.zeros(2), device="cpu"),
              "out= and device=", match="either out= or device=")
expect_raises(ValueError, lambda: hvd.recv(left, tag=22, device="meta"), "a meta device",
              match="CPU and CUDA tensors only")
expect_raises(ValueError, lambda: hvd.isend(torch.ones(2, device="meta"), right, tag=22), "a meta tensor",
              match="CPU and CUDA tensors only")
hvd.barrier()
print(f"rank {r}: {mode} {counts}", flush=True)
done()
hvd.shutdown()

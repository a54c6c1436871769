"""Run by tests/gpu: SyncBatchNorm on CUDA tensors equals BatchNorm2d on the
whole batch (every rank's shard together, computed here too, on the same
GPU): output, input gradient, running statistics, in float32 and float64;
results stay on the device; from the third step on a training step makes
no host synchronisation (torch's sync debug mode raises on one) and its
collectives skip negotiation (response cache hits); a converted CUDA model
trains."""
import torch

from gpu_common import DEVICE
import commlib
import commlib.torch as hvd
from _common import done, fail

hvd.init()
r, n = hvd.rank(), hvd.size()
C = 8

for dtype, tol in ((torch.float32, 1e-4), (torch.float64, 1e-10)):
    gen = torch.Generator().manual_seed(3)
    shards = [(torch.randn(2 + k, C, 5, 5, generator=gen, dtype=dtype) * 3 + 1).to(DEVICE)
              for k in range(n)]
    ups = [torch.randn(2 + k, C, 5, 5, generator=gen, dtype=dtype).to(DEVICE) for k in range(n)]
    ref = torch.nn.BatchNorm2d(C, dtype=dtype, device=DEVICE)
    sbn = hvd.SyncBatchNorm(C, dtype=dtype, device=DEVICE)
    with torch.no_grad():
        for m in (ref, sbn):
            m.weight.copy_(torch.linspace(0.5, 2, C, dtype=dtype))
            m.bias.copy_(torch.linspace(-1, 1, C, dtype=dtype))
    start = sum(s.shape[0] for s in shards[:r])
    rows = slice(start, start + shards[r].shape[0])
    for step in range(4):
        xf = torch.cat(shards).requires_grad_(True)
        (ref(xf) * torch.cat(ups)).sum().backward()
        xr = shards[r].clone().requires_grad_(True)
        if step >= 2:
            hits = commlib.response_cache_stats()["hits"]
            torch.cuda.set_sync_debug_mode("error")
        try:
            y = sbn(xr)
            (y * ups[r]).sum().backward()
        except RuntimeError as e:
            fail(f"SyncBatchNorm {dtype} step {step} synchronised with the host: {e}")
        finally:
            torch.cuda.set_sync_debug_mode("default")
        if step >= 2 and commlib.response_cache_stats()["hits"] - hits < 2:
            fail(f"SyncBatchNorm {dtype} step {step}: its collectives were negotiated again")
        if y.device != DEVICE or xr.grad.device != DEVICE:
            fail(f"SyncBatchNorm {dtype}: results on {y.device}, {xr.grad.device}, not {DEVICE}")
        with torch.no_grad():
            want_y = torch.nn.functional.batch_norm(
                xf, None, None, ref.weight, ref.bias, True, 0.0, ref.eps)[rows]
        for got, want, what in ((y, want_y, "output"), (xr.grad, xf.grad[rows], "input gradient"),
                                (sbn.running_mean, ref.running_mean, "running_mean"),
                                (sbn.running_var, ref.running_var, "running_var")):
            if not torch.allclose(got.detach(), want.detach(), rtol=tol, atol=tol):
                worst = (got.detach() - want.detach()).abs().max().item()
                fail(f"SyncBatchNorm {dtype} step {step} {what}: off by {worst:.3g}")
        for m in (ref, sbn):
            m.weight.grad = m.bias.grad = None
# A CUDA model converted: its BatchNorms become SyncBatchNorms on the device.
net = hvd.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(
    torch.nn.Conv2d(3, C, 3), torch.nn.BatchNorm2d(C), torch.nn.ReLU()).to(DEVICE))
if not isinstance(net[1], hvd.SyncBatchNorm) or net[1].running_mean.device != DEVICE:
    fail(f"convert_sync_batchnorm of a CUDA model: {net[1]!r} on {net[1].running_mean.device}")
out = net(torch.randn(2, 3, 6, 6, device=DEVICE))
out.sum().backward()
if out.device != DEVICE or net[0].weight.grad is None:
    fail("a converted CUDA model's step")
done()

"""Run by tests/gpu/test_gpu_p2p.py on a GPU machine: commlib.torch's
point-to-point on CUDA tensors at 2 and 4 ranks sharing the GPU, through
NCCL (COMMLIB_GPU_BACKEND=auto) or staged through pinned host memory (host):
every dtype, unknown shapes, out= on the device, device=, isend/irecv,
sendrecv, the autograd pairs, host and CUDA tensors mixed on the two ends, a
message to the rank itself,
and a 2-stage pipeline schedule whose stages live on the GPU. Results are
checked against the same exchange of CPU tensors. A ring: rank r sends to
r+1, receives from r-1."""
import gpu_common  # noqa: F401  (sets the device up before anything touches CUDA)
import torch

import commlib.torch as hvd
from gpu_common import DEVICE
from _common import done, fail

hvd.init()
r, n = hvd.rank(), hvd.size()
right, left = (r + 1) % n, (r - 1) % n


def same(got, want, what):
    if not isinstance(got, torch.Tensor) or got.device != want.device:
        fail(f"{what}: got {got!r}, expected a tensor on {want.device}")
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got.cpu(), want.cpu()):
        fail(f"{what}: got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()}")


def payload(rank, dtype, salt, device):
    shape = (rank + 1, 3) if salt % 2 else (2 + rank,)
    x = (torch.arange(int(torch.tensor(shape).prod())) * (salt + 1) + rank) % 100
    return x.reshape(shape).to(dtype).to(device)


for salt, dtype in enumerate((torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                              torch.uint8)):
    mine, theirs = payload(r, dtype, salt, DEVICE), payload(left, dtype, salt, DEVICE)
    mine.mul_(1)  # (a kernel on the current stream just before the send: the send must wait for it)
    h = hvd.isend(mine, right, tag=salt)
    same(hvd.recv(left, tag=salt, device=DEVICE), theirs, f"recv {dtype} device=cuda")
    hvd.synchronize(h)
    h = hvd.isend(mine, right, tag=salt)
    same(hvd.recv(left, tag=salt).to(DEVICE), theirs, f"recv {dtype} onto the CPU")
    hvd.synchronize(h)
    out = torch.zeros_like(theirs)
    hr = hvd.irecv(left, tag=salt, out=out)
    hvd.synchronize(hvd.isend(mine, right, tag=salt))
    if hvd.synchronize(hr) is not out:
        fail("irecv into a CUDA out did not return it")
    same(out, theirs, f"irecv {dtype} into a CUDA out")
    same(hvd.sendrecv(mine, right, left, send_tag=salt, recv_tag=salt), theirs, f"sendrecv {dtype}")

# Host and CUDA tensors mixed: a CPU tensor into a device receive, a CUDA
# tensor into a CPU out, and a large message (several NCCL chunks).
mine, theirs = payload(r, torch.float32, 7, DEVICE), payload(left, torch.float32, 7, DEVICE)
h = hvd.isend(mine.cpu(), right, tag=40)
same(hvd.recv(left, tag=40, device=DEVICE), theirs, "a CPU tensor received on the device")
hvd.synchronize(h)
out = torch.zeros_like(theirs, device="cpu")
h = hvd.isend(mine, right, tag=41)
same(hvd.recv(left, tag=41, out=out), theirs.cpu(), "a CUDA tensor received into a CPU out")
hvd.synchronize(h)
h = hvd.isend(mine, r, tag=43)  # (to itself: one copy on the device)
same(hvd.recv(r, tag=43, device=DEVICE), mine, "a CUDA tensor sent to the rank itself")
hvd.synchronize(h)
big = torch.arange(1 << 24, device=DEVICE, dtype=torch.float32) + r
same(hvd.sendrecv(big, right, left, send_tag=42, recv_tag=42), torch.arange(1 << 24, device=DEVICE,
     dtype=torch.float32) + left, "a 64 MiB sendrecv")

# Autograd pairs on the device.
x = torch.ones(3, device=DEVICE, requires_grad=True)
got = hvd.sendrecv(x * (r + 1), right, left, send_tag=50, recv_tag=50)
same(got.detach(), torch.full((3,), float(left + 1), device=DEVICE), "differentiable sendrecv")
(got * 10).sum().backward()
same(x.grad, torch.full((3,), 10.0 * (r + 1), device=DEVICE), "x.grad through sendrecv")
if r == 0:
    x = torch.ones(4, device=DEVICE, requires_grad=True)
    hvd.send(x * 2, dst=1, tag=51).backward()
    same(x.grad, torch.full((4,), 6.0, device=DEVICE), "x.grad through send/recv")
elif r == 1:
    h = hvd.recv(0, tag=51, requires_grad=True, device=DEVICE)
    (h * 3).sum().backward()

# A pipeline of two stages on ranks 0 and 1, modules on the GPU: the loss
# equals the same model's on one process.
if n >= 2:
    from commlib.torch.pipelining import PipelineStage, ScheduleGPipe
    pipe = None  # (at 2 ranks: the job itself)
    if n > 2:
        pipe = hvd.ProcessSet([0, 1])
        hvd.add_process_set(pipe)
    torch.manual_seed(0)
    full = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(DEVICE)
    data, target = torch.randn(8, 8, device=DEVICE), torch.randn(8, 1, device=DEVICE)
    want = torch.nn.functional.mse_loss(full(data), target).item()
    if r in (0, 1):
        part = full[:2] if r == 0 else full[2:]
        stage = PipelineStage(part, r, 2, process_set=pipe)
        sched = ScheduleGPipe(stage, n_microbatches=2, loss_fn=torch.nn.functional.mse_loss)
        losses = []
        if r == 0:
            sched.step(data)
        else:
            sched.step(target=target, losses=losses)
            got_loss = float(sum(l.item() for l in losses) / len(losses))
            if abs(got_loss - want) > 1e-5 * max(1.0, abs(want)):
                fail(f"pipeline loss {got_loss} != one process's {want}")
hvd.barrier()
done()
hvd.shutdown()

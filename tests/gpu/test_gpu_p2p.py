"""Point-to-point on CUDA tensors in commlib.torch, through NCCL and staged
through pinned host memory, at 2 and 4 ranks sharing one GPU: every dtype,
unknown shapes, out= and device=, host and CUDA tensors mixed, the autograd
pairs and a pipeline whose stages live on the GPU
(tests/parallel/workers/gpu_cuda_p2p.py). Both paths' steps run in CI on CPU
tensors (tests/parallel/test_torch_cuda_cpu.py; the NCCL one against the GPU
emulator, tests/parallel/test_gpu_emulated_p2p.py)."""
import pytest


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["auto", "host"])
@pytest.mark.parametrize("n", [2, 4])
def test_cuda_point_to_point(ranks, gpu_env, n, backend):
    ranks(n, "gpu_cuda_p2p.py", timeout=240, env=dict(gpu_env, COMMLIB_GPU_BACKEND=backend)).assert_ok(n)

"""Point-to-point on CUDA tensors in commlib.torch (staged through pinned host
memory) at 2 and 4 ranks sharing one GPU: every dtype, unknown shapes, out=
and device=, the autograd pairs and a pipeline whose stages live on the GPU
(tests/parallel/workers/gpu_cuda_p2p.py). The staging steps themselves run
in CI on CPU tensors (tests/parallel/test_torch_cuda_cpu.py)."""
import pytest


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 4])
def test_cuda_point_to_point(ranks, gpu_env, n):
    ranks(n, "gpu_cuda_p2p.py", timeout=240, env=gpu_env).assert_ok(n)

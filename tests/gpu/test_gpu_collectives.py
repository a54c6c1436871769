"""Every collective x dtype x op on CUDA tensors equals the CPU path's result
and is bitwise identical across ranks, at 2 and 4 ranks sharing one GPU:
through NCCL, and staged through host memory (COMMLIB_GPU_BACKEND=host).
See tests/parallel/workers/gpu_cuda_collectives.py."""
import pytest


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("backend", ["nccl", "host"])
def test_cuda_collectives_match_cpu(ranks, gpu_env, n, backend):
    env = dict(gpu_env, COMMLIB_GPU_BACKEND=backend)
    ranks(n, "gpu_cuda_collectives.py", backend, timeout=360, env=env).assert_ok(n)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", [2, 4])
def test_distributed_optimizer_on_cuda_matches_one_process(ranks, gpu_env, n):
    ranks(n, "gpu_cuda_optimizer.py", timeout=360, env=gpu_env).assert_ok(n)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", [2, 4])
def test_join_with_cuda_distributed_optimizer(ranks, gpu_env, n):
    ranks(n, "gpu_cuda_join.py", timeout=360, env=gpu_env).assert_ok(n)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", [2, 4])
def test_sync_batch_norm_on_cuda_matches_batch_norm(ranks, gpu_env, n):
    ranks(n, "gpu_cuda_sync_batch_norm.py", timeout=360, env=gpu_env).assert_ok(n)

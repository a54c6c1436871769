"""PowerSGD (DistributedOptimizer(compression=Compression.powersgd(...))) on
CUDA tensors at 2 ranks sharing one GPU: trains as the same optimizer on a
CPU copy of the model, in the same job, within 1e-9 (float64), with its state
on the GPU and bitwise-identical replicas
(tests/parallel/workers/gpu_cuda_powersgd.py). The rule itself is checked
against a simulation in CI on CPU tensors (tests/parallel/test_torch_powersgd.py)."""
import pytest


@pytest.mark.timeout(200)
def test_powersgd_on_cuda_matches_cpu(ranks, gpu_env):
    ranks(2, "gpu_cuda_powersgd.py", timeout=170, env=gpu_env).assert_ok(2)

"""NCCL on CPU-only ranks: unique ids spread over MPI, and CUDA requests that
cannot run refused on every rank with their reason (no hang)."""
import pytest

import commlib.gpu

WHEEL = commlib.gpu.wheel_library()


def assert_all_ok(run, n):
    assert run.returncode == 0, run
    for r in range(n):
        assert f"rank {r}: OK" in run.stdout, run


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.skipif(not WHEEL, reason="no nvidia-nccl-cu* wheel installed (pip install nvidia-nccl-cu13)")
def test_unique_id_is_identical_on_every_rank(ranks, n):
    assert_all_ok(ranks(n, "gpu_loading.py", "ids", timeout=90), n)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("env,expected", [
    ({"COMMLIB_GPU_BACKEND": "host"}, "COMMLIB_GPU_BACKEND=host: the core takes host buffers only"),
    ({"COMMLIB_NCCL_LIBRARY": "/nonexistent/libnccl.so.2"},
     "CUDA buffers need NCCL, which is not usable: COMMLIB_NCCL_LIBRARY='/nonexistent/libnccl.so.2'"),
    ({}, "is not usable"),
], ids=["host", "bad-nccl-path", "no-gpu"])
def test_cuda_request_refused_on_every_rank(ranks, env, expected):
    if not env and commlib.gpu.load().cuda.usable:
        pytest.skip("a GPU is visible: this case needs a machine without one")
    assert_all_ok(ranks(2, "gpu_loading.py", "refuse", expected, timeout=90, env=env), 2)

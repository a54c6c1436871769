"""tests/gpu/: commlib on a CUDA GPU. Every test here is skipped, with the
reason, unless torch sees a CUDA device and commlib can load NCCL and the
CUDA runtime (commlib.bench.bench_cuda.unavailable_reason(); ``commlibrun
--check-build`` shows the libraries).

Several ranks share one GPU as ../shared/GPU.md describes: every rank gets
its own NCCL_HOSTID (set by the workers from their MPI rank, before NCCL
starts) and NCCL talks over loopback sockets (NCCL_SOCKET_IFNAME=lo).
Run them with (README "GPU"):

    python -m pytest -v tests/gpu
"""
from __future__ import annotations

import pytest

GPU_ENV = {"NCCL_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def pytest_collection_modifyitems(config, items):
    here = [item for item in items if "tests/gpu/" in str(item.fspath).replace("\\", "/")]
    if not here:
        return
    from commlib.bench.bench_cuda import unavailable_reason
    why = unavailable_reason()
    if why:
        marker = pytest.mark.skip(reason=f"GPU test: {why}")
        for item in here:
            item.add_marker(marker)


@pytest.fixture
def gpu_env():
    return dict(GPU_ENV)

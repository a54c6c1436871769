"""tests/gpu/: commlib on a CUDA GPU. Every test here is skipped, with the
reason, unless torch sees a CUDA device and commlib can load NCCL and the
CUDA runtime (``commlibrun --check-build`` says which is missing).

Several ranks share one GPU as ../shared/GPU.md describes: every rank gets
its own NCCL_HOSTID (set by the workers from their MPI rank, before NCCL
starts) and NCCL talks over loopback sockets (NCCL_SOCKET_IFNAME=lo).
Run them with (README "GPU"):

    python -m pytest -v tests/gpu
"""
from __future__ import annotations

import pytest

GPU_ENV = {"NCCL_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def _why_no_gpu() -> str:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA device visible to torch {torch.__version__}"
    import commlib.gpu
    status = commlib.gpu.load()
    if not status.nccl.usable:
        return f"NCCL is not usable: {status.nccl.error}"
    if not status.cuda.usable:
        return f"the CUDA runtime is not usable: {status.cuda.error}"
    return ""


def pytest_collection_modifyitems(config, items):
    here = [item for item in items if "tests/gpu/" in str(item.fspath).replace("\\", "/")]
    if not here:
        return
    why = _why_no_gpu()
    if why:
        marker = pytest.mark.skip(reason=f"GPU test: {why}")
        for item in here:
            item.add_marker(marker)


@pytest.fixture
def gpu_env():
    return dict(GPU_ENV)

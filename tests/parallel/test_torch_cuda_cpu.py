"""commlib.torch's CUDA routing on machines without a GPU: the host-staging
steps against the direct CPU path, refusals of other devices, and the one-time
message naming the path (see workers/torch_cuda_staging.py). The GPU itself is
tested by tests/gpu/."""
import pytest

pytest.importorskip("torch")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,env,path", [
    (2, {"COMMLIB_GPU_BACKEND": "host"}, "host"),
    (3, {}, "host"),
], ids=["2-host", "3-auto"])
def test_staging_on_cpu(ranks, n, env, path):
    import torch
    if not env and torch.cuda.is_available():
        pytest.skip("a GPU is visible: auto would choose NCCL")
    run = ranks(n, "torch_cuda_staging.py", path, timeout=120, env=env)
    run.assert_ok(n)
    announced = [line for line in run.stderr.splitlines() if "commlib: CUDA tensors go " in line]
    assert len(announced) == n, run.stderr  # once per rank
    why = "COMMLIB_GPU_BACKEND=host" if env else "NCCL is not usable"
    assert all("staged through pinned host memory and the CPU path: " + why in line for line in announced)


def test_nccl_reducible():
    import torch
    from commlib.ops import Adasum, Average, Max, Min, Product, Sum
    from commlib.torch.cuda.cuda_nccl import can_reduce
    assert can_reduce(torch.float16, Average, 1.0, 1.0)
    assert can_reduce(torch.bfloat16, Sum, 0.5, 2.0)
    assert can_reduce(torch.int64, Product, 1.0, 1.0)
    assert can_reduce(torch.uint8, Max, 1.0, 1.0)
    assert not can_reduce(torch.int16, Sum, 1.0, 1.0)
    assert not can_reduce(torch.bool, Max, 1.0, 1.0)
    assert not can_reduce(torch.int32, Average, 1.0, 1.0)
    assert not can_reduce(torch.int32, Sum, 2.0, 1.0)
    assert not can_reduce(torch.float32, Min, 2.0, 1.0)
    assert not can_reduce(torch.float32, Adasum, 1.0, 1.0)  # (the host's algorithm runs it)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_point_to_point_staging_on_cpu(ranks, n):
    """send/recv/isend/irecv/sendrecv and their autograd pairs through the
    host-staging steps CUDA tensors take (workers/torch_p2p_cuda_paths.py)."""
    ranks(n, "torch_p2p_cuda_paths.py", "staged", timeout=120).assert_ok(n)


def test_device_buffer_dtype_codes_need_no_ml_dtypes():
    """The core's view of a CUDA tensor takes its dtype code from torch's
    dtype, in a process that never imported ml_dtypes (numpy then knows no
    bfloat16: the first GPU run failed every bfloat16 collective so)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, torch\n"
        "from commlib.dtypes import code_of\n"
        "from commlib.torch.cuda.cuda_nccl import _buffer\n"
        "assert 'ml_dtypes' not in sys.modules, 'imported ml_dtypes: this test proves nothing'\n"
        "for name in ('bfloat16', 'float16', 'float32', 'int64', 'uint8', 'bool'):\n"
        "    got = _buffer(torch.zeros(3, dtype=getattr(torch, name))).dtype\n"
        "    assert got == code_of(name), (name, got)\n"
        "try:\n"
        "    _buffer(torch.zeros(3, dtype=torch.complex64))\n"
        "except TypeError as e:\n"
        "    assert 'complex64' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('complex64 accepted')\n"
        "print('ok')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(root), timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr

"""commlib.torch collectives, autograd, argument and mismatch errors, objects,
join/barrier and SyncBatchNorm, on 2 and 3 ranks (each rank checks its own
results against torch/numpy; see workers/torch_collectives.py)."""
import pytest

pytest.importorskip("torch")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_torch_collectives(ranks, n):
    run = ranks(n, "torch_collectives.py", timeout=120)
    run.assert_ok(n)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 3])
def test_torch_reducescatter_gradients(ranks, n):
    """Horovod's reducescatter gradients (workers/torch_reducescatter_grad.py):
    every op and scale factors, global set and a subset, single and grouped."""
    run = ranks(n, "torch_reducescatter_grad.py", timeout=60)
    run.assert_ok(n)

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

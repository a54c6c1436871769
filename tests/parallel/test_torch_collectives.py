"""commlib.torch collectives, autograd, argument and mismatch errors, objects,
join/barrier and SyncBatchNorm, on 2 and 3 ranks (each rank checks its own
results against torch/numpy; see workers/torch_collectives.py).

The workers run in one job (workers/in_one_job.py: torch starts once on
each rank); a worker that fails ends it, failing the tests of the workers
after it as well."""
import pytest
from one_job import scripts_in_one_job

pytest.importorskip("torch")

one_job = scripts_in_one_job("torch_collectives.py", "torch_reducescatter_grad.py", timeout=180)


@pytest.mark.timeout(250)
@pytest.mark.parametrize("n", [2, 3])
def test_torch_collectives(one_job, n):
    one_job(n).assert_script_ok("torch_collectives.py", n)


@pytest.mark.timeout(250)
@pytest.mark.parametrize("n", [2, 3])
def test_torch_reducescatter_gradients(one_job, n):
    """Horovod's reducescatter gradients (workers/torch_reducescatter_grad.py):
    every op and scale factors, global set and a subset, single and grouped."""
    one_job(n).assert_script_ok("torch_reducescatter_grad.py", n)

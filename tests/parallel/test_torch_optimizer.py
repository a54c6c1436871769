"""commlib.torch.DistributedOptimizer and the model helpers on 3 ranks (the frontend's rules
are the same at any size, and 3 ranks split unevenly; the core's
collectives under it run at 2, 3 and 4 ranks in test_collectives.py)
(see workers/torch_optimizer.py): N ranks x batch B end with the parameters
of one process trained on the N*B batch (within 1e-5 relative, bitwise equal
across ranks), gradient accumulation, clipping with skip_synchronize, unused
parameters, zero_grad with allreduces in flight, parameter lists that differ
across ranks, unsupported dtypes/devices, groups, sparse gradients,
compression, broadcast of parameters and optimizer state.

The workers run in one job (workers/in_one_job.py: torch starts once on
each rank); a worker that fails ends it, failing the tests of the workers
after it as well."""
import re

import pytest
from one_job import scripts_in_one_job

pytest.importorskip("torch")

one_job = scripts_in_one_job("torch_optimizer.py", "torch_broadcast_state.py", "torch_sparse_dense.py", timeout=200)


@pytest.mark.timeout(250)
@pytest.mark.parametrize("n", [3])
def test_torch_distributed_optimizer(one_job, n):
    run = one_job(n)
    run.assert_script_ok("torch_optimizer.py", n)
    m = re.search(r"max relative error SGD (\S+), Adam (\S+)", run.stdout)
    assert m and float(m.group(1)) <= 1e-5 and float(m.group(2)) <= 1e-5, run


@pytest.mark.timeout(250)
@pytest.mark.parametrize("n", [3])
def test_torch_broadcast_optimizer_state(one_job, n):
    """broadcast_optimizer_state as Horovod's (workers/torch_broadcast_state.py):
    fresh optimizers get state from a zero-gradient step, root's state wins."""
    one_job(n).assert_script_ok("torch_broadcast_state.py", n)


@pytest.mark.timeout(250)
@pytest.mark.parametrize("n", [3])
def test_torch_sparse_gradients_back_as_sparse(one_job, n):
    """SparseAdam/SGD on a sparse embedding with sparse_as_dense=True and False
    (workers/torch_sparse_dense.py): replicas identical after every step and
    within 1e-5 of one process on the combined batch."""
    run = one_job(n)
    run.assert_script_ok("torch_sparse_dense.py", n)
    errs = [float(e) for e in re.findall(r"sparse max relative error (\S+)", run.stdout)]
    assert len(errs) == n and max(errs) <= 1e-5, run

"""commlib.torch.DistributedOptimizer and the model helpers on 3 ranks (the frontend's rules
are the same at any size, and 3 ranks split unevenly; the core's
collectives under it run at 2, 3 and 4 ranks in test_collectives.py)
(see workers/torch_optimizer.py): N ranks x batch B end with the parameters
of one process trained on the N*B batch (within 1e-5 relative, bitwise equal
across ranks), gradient accumulation, clipping with skip_synchronize, unused
parameters, zero_grad with allreduces in flight, parameter lists that differ
across ranks, unsupported dtypes/devices, groups, sparse gradients,
compression, broadcast of parameters and optimizer state."""
import re

import pytest

pytest.importorskip("torch")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [3])
def test_torch_distributed_optimizer(ranks, n):
    run = ranks(n, "torch_optimizer.py", timeout=120)
    run.assert_ok(n)
    m = re.search(r"max relative error SGD (\S+), Adam (\S+)", run.stdout)
    assert m and float(m.group(1)) <= 1e-5 and float(m.group(2)) <= 1e-5, run


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [3])
def test_torch_broadcast_optimizer_state(ranks, n):
    """broadcast_optimizer_state as Horovod's (workers/torch_broadcast_state.py):
    fresh optimizers get state from a zero-gradient step, root's state wins."""
    run = ranks(n, "torch_broadcast_state.py", timeout=60)
    run.assert_ok(n)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [3])
def test_torch_sparse_gradients_back_as_sparse(ranks, n):
    """SparseAdam/SGD on a sparse embedding with sparse_as_dense=True and False
    (workers/torch_sparse_dense.py): replicas identical after every step and
    within 1e-5 of one process on the combined batch."""
    run = ranks(n, "torch_sparse_dense.py", timeout=60)
    run.assert_ok(n)
    errs = [float(e) for e in re.findall(r"sparse max relative error (\S+)", run.stdout)]
    assert len(errs) == n and max(errs) <= 1e-5, run

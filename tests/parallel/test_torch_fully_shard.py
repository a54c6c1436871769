"""fully_shard (ZeRO stage 3) on 3 ranks (the frontend's rules
are the same at any size, and 3 ranks split unevenly; the core's
collectives under it run at 2, 3 and 4 ranks in test_collectives.py).

workers/torch_fully_shard.py: 20 Adam steps within 1e-5 relative of the
unsharded DistributedOptimizer, shards in model.parameters() and the memory
report, full_parameters with write-back, no_grad forward, a clear error when
reading a sharded parameter outside forward, argument errors.

workers/torch_fsdp_prefetch.py: prefetching, bitwise equal to prefetch=False
through skipped blocks (a prefetched gather goes unused), a shard changed in
place and a forward that raises; within 1e-5 of unsharded training.

The workers run in one job (workers/in_one_job.py: torch starts once on
each rank); a worker that fails ends it, failing the tests of the workers
after it as well."""
import re

import pytest
from one_job import scripts_in_one_job

pytest.importorskip("torch")

# (the prefetch worker first: it names the units fsdp0, fsdp1... of a fresh process)
one_job = scripts_in_one_job("torch_fsdp_prefetch.py", "torch_fully_shard.py", "torch_fsdp_root.py",
                             timeout=200)


def run_and_check(one_job, n, worker, label):
    run = one_job(n)
    run.assert_script_ok(worker, n)
    errs = [float(e) for e in re.findall(label + r" max relative error ([0-9.e+-]+)", run.stdout)]
    assert len(errs) == n and max(errs) <= 1e-5, run


@pytest.mark.timeout(250)
@pytest.mark.parametrize("n", [3])
def test_fully_shard(one_job, n):
    run_and_check(one_job, n, "torch_fully_shard.py", "fully_shard")


@pytest.mark.timeout(250)
@pytest.mark.parametrize("n", [3])
def test_fully_shard_prefetch(one_job, n):
    run_and_check(one_job, n, "torch_fsdp_prefetch.py", "prefetch")


@pytest.mark.timeout(250)
@pytest.mark.parametrize("n", [3])
def test_fully_shard_root_without_parameters(one_job, n):
    """workers/torch_fsdp_root.py: PyTorch's root pattern (the root owns no
    parameters) and a deeper tree, within 1e-5 of unsharded training."""
    run_and_check(one_job, n, "torch_fsdp_root.py", "root")

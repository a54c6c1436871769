"""fully_shard (ZeRO stage 3) on 3 ranks (the frontend's rules
are the same at any size, and 3 ranks split unevenly; the core's
collectives under it run at 2, 3 and 4 ranks in test_collectives.py).

workers/torch_fully_shard.py: 20 Adam steps within 1e-5 relative of the
unsharded DistributedOptimizer, shards in model.parameters() and the memory
report, full_parameters with write-back, no_grad forward, a clear error when
reading a sharded parameter outside forward, argument errors.

workers/torch_fsdp_prefetch.py: prefetching, bitwise equal to prefetch=False
through skipped blocks (a prefetched gather goes unused), a shard changed in
place and a forward that raises; within 1e-5 of unsharded training."""
import re

import pytest

pytest.importorskip("torch")


def run_and_check(ranks, n, worker, label):
    run = ranks(n, worker, timeout=90)
    run.assert_ok(n)
    errs = [float(e) for e in re.findall(label + r" max relative error ([0-9.e+-]+)", run.stdout)]
    assert len(errs) == n and max(errs) <= 1e-5, run


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [3])
def test_fully_shard(ranks, n):
    run_and_check(ranks, n, "torch_fully_shard.py", "fully_shard")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [3])
def test_fully_shard_prefetch(ranks, n):
    run_and_check(ranks, n, "torch_fsdp_prefetch.py", "prefetch")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [3])
def test_fully_shard_root_without_parameters(ranks, n):
    """workers/torch_fsdp_root.py: PyTorch's root pattern (the root owns no
    parameters) and a deeper tree, within 1e-5 of unsharded training."""
    run_and_check(ranks, n, "torch_fsdp_root.py", "root")

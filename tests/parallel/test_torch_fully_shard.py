"""fully_shard (ZeRO stage 3) on 2 and 3 ranks (workers/torch_fully_shard.py):
20 Adam steps within 1e-5 relative of the unsharded DistributedOptimizer,
shards in model.parameters() and the memory report, full_parameters with
write-back, no_grad forward, a clear error when reading a sharded parameter
outside forward, argument errors."""
import re

import pytest

pytest.importorskip("torch")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_fully_shard(ranks, n):
    run = ranks(n, "torch_fully_shard.py", timeout=90)
    run.assert_ok(n)
    errs = [float(e) for e in re.findall(r"fully_shard max relative error (\S+)", run.stdout)]
    assert len(errs) == n and max(errs) <= 1e-5, run

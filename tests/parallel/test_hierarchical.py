"""The multi-host (hierarchical) allreduce, on simulated hosts."""
import pytest


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n,per_host", [(4, 2), (3, 2), (4, 1), (4, 4)])
def test_allreduce_across_simulated_hosts(ranks, n, per_host):
    # (4, 2): two hosts of two ranks, hierarchical. (3, 2): hosts of unequal
    # size, which falls back to MPI. (4, 1): one rank per host. (4, 4): one host.
    run = ranks(n, "hier_allreduce.py", timeout=150, env={"COMMLIB_TEST_RANKS_PER_HOST": str(per_host)})
    run.assert_ok(n)

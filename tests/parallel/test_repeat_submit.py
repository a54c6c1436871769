"""Repeated named collectives on one array, arguments changing under a name,
small broadcasts fused, and the route of a large alltoall (workers/repeat_submit.py): through each
rank reading the others' inputs directly (3 ranks), or through MPI with
COMMLIB_P2P_SINGLE_COPY=0 (2 ranks)."""
import pytest

# requests in flight together are held until the submissions stop, so that a
# loaded machine's Python between two submissions splits no fused batch
HELD = {"COMMLIB_BATCH_GAP_US": "100000", "COMMLIB_CYCLE_TIME": "200"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,env,route", [
    pytest.param(3, HELD, "shm-direct", id="np3-direct"),
    pytest.param(2, {**HELD, "COMMLIB_P2P_SINGLE_COPY": "0"}, "mpi", id="np2-mpi"),
])
def test_repeated_calls_and_large_alltoall(ranks, tmp_path, n, env, route):
    ranks(n, "repeat_submit.py", route, str(tmp_path / "trace.json"), timeout=90, env=env).assert_ok(n)

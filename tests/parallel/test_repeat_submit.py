"""Repeated named collectives on one array, arguments changing under a name,
and the route of a large alltoall (workers/repeat_submit.py): through each
rank reading the others' inputs directly (3 ranks), or through MPI with
COMMLIB_P2P_SINGLE_COPY=0 (2 ranks)."""
import pytest


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,env,route", [
    pytest.param(3, {}, "shm-direct", id="np3-direct"),
    pytest.param(2, {"COMMLIB_P2P_SINGLE_COPY": "0"}, "mpi", id="np2-mpi"),
])
def test_repeated_calls_and_large_alltoall(ranks, tmp_path, n, env, route):
    ranks(n, "repeat_submit.py", route, str(tmp_path / "trace.json"), timeout=90, env=env).assert_ok(n)

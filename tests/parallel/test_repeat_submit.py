"""Repeated named collectives on one array, arguments changing under a name,
small broadcasts fused, and the routes of a large alltoall, allgather and
broadcast (workers/repeat_submit.py): each rank reading the others' buffers
directly where auto picks that (the alltoall at 2 and 3 ranks, the allgather
at 2, the broadcast at 3; at 2 the broadcast's copy split between root and
receiver), the shared regions for the rest; with
COMMLIB_P2P_SINGLE_COPY=0 the regions, and MPI for the large alltoall."""
import pytest

# requests in flight together are held until the submissions stop, so that a
# loaded machine's Python between two submissions splits no fused batch
HELD = {"COMMLIB_BATCH_GAP_US": "100000", "COMMLIB_CYCLE_TIME": "200"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,env,routes", [
    pytest.param(3, HELD, "a2a=shm-direct,ag=shm,bc=shm-direct", id="np3-direct"),
    pytest.param(2, HELD, "a2a=shm-direct,ag=shm-direct,bc=shm-split", id="np2-direct"),
    pytest.param(2, {**HELD, "COMMLIB_P2P_SINGLE_COPY": "0"}, "a2a=mpi,ag=shm,bc=shm", id="np2-no-single-copy"),
])
def test_repeated_calls_and_large_collectives(ranks, tmp_path, n, env, routes):
    ranks(n, "repeat_submit.py", routes, str(tmp_path / "trace.json"), timeout=90, env=env).assert_ok(n)

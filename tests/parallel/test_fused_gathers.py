"""Allgathers and reducescatters in flight together run fused, one
collective per batch (csrc/exec/fused_gathers.cc), with the results of
running them one by one: checked against numpy on every rank at 2 and 3
ranks, through shared memory and through MPI, from negotiation and from the
response cache, on a process set, in regions of 256 bytes (many windows), with a
wrong `out` failing only its own request. The timeline must show that fusion happened."""
import pytest

from test_collectives import assert_all_ok

MPI_PATHS = {"COMMLIB_SHM_COLLECTIVES": "never"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,env", [pytest.param(2, {}, id="np2"), pytest.param(3, {}, id="np3"),
                                   pytest.param(3, MPI_PATHS, id="np3-mpi"),
                                   pytest.param(3, {"COMMLIB_FUSION_THRESHOLD": "256"}, id="np3-small-fusion"),
                                   pytest.param(3, {"COMMLIB_SHM_FUSION_BYTES": "256"}, id="np3-small-regions")])
def test_fused_allgathers_and_reducescatters(ranks, tmp_path, n, env):
    run = ranks(n, "coll_fused_gathers.py", str(tmp_path / "timeline.json"), timeout=120, env=env)
    assert_all_ok(run, n)

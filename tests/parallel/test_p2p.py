"""Point-to-point send/recv at 2 and 3 ranks: every rank checks what it
received against numpy; the single-copy path, the MPI rendezvous path (one
host without single copy, and pretended separate hosts) and header-carried
messages are each covered, with control messages through one host's
shared-memory lanes and through MPI, and so are the failure paths."""

import pytest
from concurrent_jobs import in_background, started_together

LAYOUTS = {
    "single-copy": {},
    "mpi-rendezvous": {"COMMLIB_P2P_SINGLE_COPY": "0"},
    "two-hosts": {"COMMLIB_TEST_RANKS_PER_HOST": "1"},
    "mpi-control": {"COMMLIB_SHM": "0"},  # one host, control messages through MPI
    "all-rendezvous": {"COMMLIB_P2P_EAGER_BYTES": "0"},
}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_p2p_every_case_checked_on_every_rank(ranks, n, layout):
    ranks(n, "p2p_numpy.py", timeout=150, env=LAYOUTS[layout]).assert_ok(n)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_p2p_and_collectives_from_several_threads(ranks, n):
    ranks(n, "p2p_threads.py", timeout=100).assert_ok(n)


def start_dead_peer(request, tmp, n):
    return in_background(request.getfixturevalue("ranks"), n, "p2p_failures.py", "dead", timeout=100)


# (both rank counts at once: each waits for the launcher's grace after the death)
dead_peer_job = started_together("test_p2p_dead_peer_raises_rank_lost", start_dead_peer, "dead_peer_job")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_p2p_dead_peer_raises_rank_lost(dead_peer_job, n):
    run = dead_peer_job[0]
    assert run.seconds < 60, run
    assert run.returncode == 137, run
    assert "rank 0: RankLostError" in run.stdout, run
    assert "rank 0: send failed too" in run.stdout, run


@pytest.mark.timeout(150)
def test_p2p_stalled_receive_is_reported(ranks):
    run = ranks(3, "p2p_failures.py", "stall", timeout=100, env={"COMMLIB_STALL_CHECK_TIME": "1"})
    run.assert_ok(3)
    assert "recv from rank 1 (tag 77) has waited" in run.stderr, run


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_p2p_peer_shutdown_fails_waiting_receive(ranks, n):
    ranks(n, "p2p_failures.py", "shutdown", timeout=100).assert_ok(n)

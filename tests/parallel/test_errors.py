"""Error paths across ranks: mismatches, names in flight, shutdown, stalls,
and a rank that dies. Each run has a timeout, so a hang fails the test."""
import importlib.util

import pytest
from concurrent_jobs import in_background, started_together


def assert_all_ok(run, n):
    for r in range(n):
        assert f"rank {r}: OK" in run.stdout, run


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_mismatches_raise_on_every_rank_and_job_recovers(ranks, n):
    run = ranks(n, "errors_mismatch.py", timeout=120)
    assert run.returncode == 0, run
    assert_all_ok(run, n)


@pytest.mark.timeout(150)
def test_name_in_flight_is_refused(ranks):
    run = ranks(2, "errors_inflight.py", timeout=90)
    assert run.returncode == 0, run
    assert_all_ok(run, 2)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_rank_that_shuts_down_does_not_hang_others(ranks, n):
    run = ranks(n, "errors_shutdown.py", timeout=90)
    assert run.returncode == 0, run
    assert_all_ok(run, n)


@pytest.mark.timeout(150)
def test_stall_is_reported_and_late_rank_completes(ranks):
    run = ranks(3, "errors_stall.py", timeout=90, env={"COMMLIB_STALL_CHECK_TIME": "1"})
    assert run.returncode == 0, run
    assert_all_ok(run, 3)
    assert "'late' has waited" in run.stderr, run
    assert "still missing on ranks [2]" in run.stderr, run


def start_dead_rank(request, tmp, n, victim):
    return in_background(request.getfixturevalue("ranks"), n, "dead_rank.py", str(victim), timeout=100)


# (the cases at once: each waits for the launcher's grace after the death)
dead_rank_job = started_together("test_dead_rank_is_named_and_job_ends", start_dead_rank,
                                 "dead_rank_job")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,victim", [(2, 1), (3, 1), (3, 0)])
def test_dead_rank_is_named_and_job_ends(dead_rank_job, n, victim):
    """SIGKILL one rank mid-job: survivors raise RankLostError naming it
    (they exit with code 3 after checking), and the launcher ends the job
    with the victim's code 137, naming the victim, well within 60 s."""
    run = dead_rank_job[0]
    assert run.seconds < 60, run
    assert run.returncode == 137, run
    survivors = [r for r in range(n) if r != victim]
    for r in survivors:
        assert f"rank {r}: RankLostError" in run.stdout, run
        assert f"rank {r}: later collective also raised" in run.stdout, run
    assert f"rank {victim}" in run.stderr and "SIGKILL" in run.stderr, run


def framework_of(mode):
    return "tensorflow" if mode.startswith("keras") else "torch"


def start_async_dead_rank(request, tmp, mode, n, victim):
    if importlib.util.find_spec(framework_of(mode)) is None:
        return None  # (the case is skipped)
    return in_background(request.getfixturevalue("ranks"), n, "async_dead_rank.py", mode, str(victim),
                         timeout=100)


# (the cases at once: each waits for the launcher's grace after the death)
async_dead_rank_job = started_together("test_dead_rank_during_asynchronous_exchange",
                                       start_async_dead_rank, "async_dead_rank_job")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode,n,victim", [
    pytest.param(mode, n, victim, marks=pytest.mark.skipif(
        importlib.util.find_spec(framework_of(mode)) is None, reason=f"needs {framework_of(mode)}"))
    for mode, n, victim in [("torch-staleness", 3, 1), ("torch-stream", 2, 0),
                            ("keras-staleness", 2, 1), ("keras-stream", 3, 0)]])
def test_dead_rank_during_asynchronous_exchange(async_dead_rank_job, mode, n, victim):
    """SIGKILL a rank while a delayed average or a streaming meeting is in
    flight: the survivors' next step, synchronize() and a later collective
    raise RankLostError naming it (exit code 3 after the checks), within 60 s."""
    run = async_dead_rank_job[0]
    assert run.returncode == 137, run
    for r in range(n):
        if r != victim:
            assert f"rank {r}: RankLostError in training" in run.stdout, run
            assert f"rank {r}: synchronize() and a later collective also raised" in run.stdout, run


@pytest.mark.timeout(200)
def test_exit_with_unsynchronized_handles_does_not_hang(ranks):
    # Timing-dependent before the shutdown handshake (2-4 hangs in 10 runs).
    for _ in range(5):
        run = ranks(3, "exit_with_pending.py", timeout=30)
        assert run.returncode == 0, run
        assert_all_ok(run, 3)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_reinit_after_shutdown_with_a_pending_request(ranks, n):
    run = ranks(n, "errors_reinit_pending.py", timeout=90)
    assert run.returncode == 0, run
    assert_all_ok(run, n)


def start_timeouts(request, tmp, n, layout):
    return in_background(request.getfixturevalue("ranks"), n, "errors_timeout.py", timeout=120,
                         env={"COMMLIB_TIMEOUT": "2", **layout})


# (both layouts' jobs at once: each waits out ~10 timeouts, using little CPU)
timeout_job = started_together("test_timeout_fails_waiting_ranks_naming_the_missing", start_timeouts,
                               "timeout_job")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,layout", [(3, {}), (3, {"COMMLIB_TEST_RANKS_PER_HOST": "1"})])
def test_timeout_fails_waiting_ranks_naming_the_missing(timeout_job, n, layout):
    """COMMLIB_TIMEOUT=2: a tensor never submitted by one rank, unnamed
    collectives of different kinds, a skipped cached request, an unmatched
    receive, a rank frozen (SIGSTOP) shorter and longer than the timeout
    (see workers/errors_timeout.py)."""
    timeout_job[0].assert_ok(n)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,layout", [(2, {}), (3, {}), (3, {"COMMLIB_TEST_RANKS_PER_HOST": "1"})])
def test_local_error_on_one_rank_fails_the_others_at_once(ranks, n, layout):
    """Bad alltoall splits on rank 1 (named, unnamed, a cached name): the
    others raise CollectiveMismatchError naming rank 1 and its reason at
    once (see workers/errors_abort.py)."""
    ranks(n, "errors_abort.py", timeout=100, env=layout).assert_ok(n)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,layout", [(2, {}), (3, {"COMMLIB_TEST_RANKS_PER_HOST": "1"})])
def test_call_refused_in_python_on_one_rank_fails_the_others_at_once(ranks, n, layout):
    """A bad root, out= or 0-d tensor refused by the numpy API, commlib.torch
    or its CUDA route on rank 1: the others raise CollectiveMismatchError at
    once, and later unnamed calls still pair rank by rank (see
    workers/errors_refused.py)."""
    ranks(n, "errors_refused.py", timeout=100, env=layout).assert_ok(n)

"""The response cache (workers/response_cache.py, cache_departures.py,
cache_shuffle.py): steady-state rounds of every collective hit the cache and
stay right on every rank; changed, mismatched and late requests fall back to
the coordinator; departures and stalls are reported, never hung. On one host
the cache skips rank 0 through the order log; across hosts (pretended with
COMMLIB_TEST_RANKS_PER_HOST) and without the shared segment, rank 0 orders
the cached requests from one small message per host (or rank)."""
import pytest
from concurrent_jobs import in_background, started_together

ONE_HOST = {}
TWO_HOSTS = {"COMMLIB_TEST_RANKS_PER_HOST": "2"}
NO_SHM = {"COMMLIB_SHM": "0"}
LAYOUTS = [(2, ONE_HOST), (3, ONE_HOST), (4, ONE_HOST), (4, TWO_HOSTS), (3, NO_SHM)]
LAYOUT_IDS = ["2", "3", "4", "4-two-hosts", "3-no-shm"]


def start_steady_state(request, tmp, n, env):
    return in_background(request.getfixturevalue("ranks"), n, "response_cache.py", timeout=150,
                         env={"COMMLIB_STALL_CHECK_TIME": "2", **env})


# (the layouts at once: each job mostly waits out its stall check)
steady_state_job = started_together("test_cache_steady_state_and_fallbacks", start_steady_state,
                                    "steady_state_job")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n,env", LAYOUTS, ids=LAYOUT_IDS)
def test_cache_steady_state_and_fallbacks(steady_state_job, n, env):
    steady_state_job[0].assert_ok(n)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("env", [ONE_HOST, TWO_HOSTS], ids=["one-host", "two-hosts"])
def test_tiny_cache(ranks, env):
    run = ranks(4, "response_cache.py", "small", timeout=150,
                env={"COMMLIB_STALL_CHECK_TIME": "2", "COMMLIB_CACHE_CAPACITY": "2", **env})
    run.assert_ok(4)


@pytest.mark.timeout(200)
def test_cache_off(ranks):
    run = ranks(2, "response_cache.py", "off", timeout=150,
                env={"COMMLIB_STALL_CHECK_TIME": "2", "COMMLIB_CACHE_CAPACITY": "0"})
    run.assert_ok(2)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,leaver,env", [(2, 1, ONE_HOST), (3, 2, ONE_HOST), (3, 0, ONE_HOST),
                                          (4, 3, TWO_HOSTS), (4, 0, TWO_HOSTS)],
                         ids=["2-worker", "3-worker", "3-coordinator", "two-hosts-worker",
                              "two-hosts-coordinator"])
def test_shutdown_while_others_wait_at_a_cache_bit(ranks, n, leaver, env):
    run = ranks(n, "cache_departures.py", "shutdown", str(leaver), timeout=90, env=env)
    run.assert_ok(n)


def start_stalled(request, tmp, n, env):
    return in_background(request.getfixturevalue("ranks"), n, "cache_departures.py", "stall", timeout=90,
                         env={"COMMLIB_STALL_CHECK_TIME": "1", **env})


# (both layouts at once: each job waits for its stall warning)
stalled_job = started_together("test_stalled_cached_request_is_reported", start_stalled, "stalled_job")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,env", [(3, ONE_HOST), (4, TWO_HOSTS)], ids=["one-host", "two-hosts"])
def test_stalled_cached_request_is_reported(stalled_job, n, env):
    run = stalled_job[0]
    run.assert_ok(n)
    assert "'steady' has waited" in run.stderr, run
    assert f"still missing on ranks [{n - 1}]" in run.stderr, run


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n,env", [(2, ONE_HOST), (3, ONE_HOST), (4, TWO_HOSTS)],
                         ids=["2", "3", "4-two-hosts"])
def test_shuffled_submission_orders(ranks, n, env):
    run = ranks(n, "cache_shuffle.py", "300", timeout=150, env=env)
    run.assert_ok(n)


@pytest.mark.timeout(120)
def test_a_cached_step_of_128_runs_as_one_collective(ranks, tmp_path):
    run = ranks(2, "cache_one_step.py", str(tmp_path / "trace.json"), timeout=90,
                env={"COMMLIB_BATCH_GAP_US": "100000000", "COMMLIB_CYCLE_TIME": "100000"})
    run.assert_ok(2)

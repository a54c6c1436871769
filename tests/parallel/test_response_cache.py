"""The response cache (workers/response_cache.py): steady-state rounds of
every collective hit the cache and stay right on every rank; changed,
mismatched and late requests fall back to the coordinator; a tiny cache and
a disabled cache give the same results."""
import pytest


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_cache_steady_state_and_fallbacks(ranks, n):
    run = ranks(n, "response_cache.py", timeout=150, env={"COMMLIB_STALL_CHECK_TIME": "2"})
    run.assert_ok(n)


@pytest.mark.timeout(200)
def test_tiny_cache(ranks):
    run = ranks(3, "response_cache.py", "small", timeout=150,
                env={"COMMLIB_STALL_CHECK_TIME": "2", "COMMLIB_CACHE_CAPACITY": "2"})
    run.assert_ok(3)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n,env", [(2, {"COMMLIB_CACHE_CAPACITY": "0"}),
                                   (4, {"COMMLIB_TEST_RANKS_PER_HOST": "2"})],
                         ids=["capacity-0", "two-hosts"])
def test_cache_off(ranks, n, env):
    run = ranks(n, "response_cache.py", "off", timeout=150, env={"COMMLIB_STALL_CHECK_TIME": "2", **env})
    run.assert_ok(n)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,leaver", [(2, 1), (3, 2), (3, 0)])
def test_shutdown_while_others_wait_at_a_cache_bit(ranks, n, leaver):
    run = ranks(n, "cache_departures.py", "shutdown", str(leaver), timeout=90)
    run.assert_ok(n)


@pytest.mark.timeout(150)
def test_stalled_cached_request_is_reported(ranks):
    run = ranks(3, "cache_departures.py", "stall", timeout=90, env={"COMMLIB_STALL_CHECK_TIME": "1"})
    run.assert_ok(3)
    assert "'steady' has waited" in run.stderr, run
    assert "still missing on ranks [2]" in run.stderr, run


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_shuffled_submission_orders(ranks, n):
    run = ranks(n, "cache_shuffle.py", "300", timeout=150)
    run.assert_ok(n)

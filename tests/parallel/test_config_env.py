"""A bad COMMLIB_* value makes init() raise ValueError on every rank, and no
rank hangs when only some ranks have it (the ranks agree on the verdict
before any other communication of init). Each run has a timeout."""
import time

import pytest

LIMIT = 60  # the launcher kills a hung job after this many seconds


def assert_all_ok(run, n):
    assert run.returncode == 0, run
    for r in range(n):
        assert f"rank {r}: OK" in run.stdout, run


@pytest.mark.timeout(150)
def test_bad_value_on_every_rank(ranks):
    run = ranks(2, "config_env.py", "all", timeout=LIMIT, env={"COMMLIB_FUSION_THRESHOLD": "abc"})
    assert_all_ok(run, 2)


@pytest.mark.timeout(150)
def test_bad_value_on_one_rank_fails_every_rank(ranks):
    start = time.monotonic()
    run = ranks(2, "config_env.py", "one", timeout=LIMIT)
    assert_all_ok(run, 2)
    assert time.monotonic() - start < LIMIT


@pytest.mark.timeout(150)
def test_different_bad_values_each_named_by_its_rank(ranks):
    run = ranks(2, "config_env.py", "each", timeout=LIMIT)
    assert_all_ok(run, 2)


@pytest.mark.timeout(150)
def test_uncaught_error_on_one_rank_ends_the_job(ranks):
    """Nobody catches the ValueError: every rank's script ends with it (the
    launcher's exit code is a failure, not its timeout's 124)."""
    start = time.monotonic()
    run = ranks(2, "config_env.py", "uncaught", timeout=LIMIT)
    assert run.returncode not in (0, 124), run
    assert time.monotonic() - start < LIMIT
    errors = [line for line in run.stderr.splitlines()
              if "ValueError: COMMLIB_CYCLE_TIME='1ms': not a number" in line]
    assert len(errors) == 2, run
    assert any("(in the environment of rank 1)" in line for line in errors), run

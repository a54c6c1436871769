"""A bad COMMLIB_* value makes init() raise ValueError on every rank, and no
rank hangs when only some ranks have it (the ranks agree on the verdict
before any other communication of init). Each run has a timeout."""
import time

import pytest

LIMIT = 60  # the launcher kills a hung job after this many seconds
# The 4 allreduces of horovod_env.py are held until synchronize() however
# slowly a loaded host runs the submitting thread (by default a request is
# released once none arrived for 20 us, so fusion depended on timing).
HOLD = {"COMMLIB_BATCH_GAP_US": "2000000", "COMMLIB_CYCLE_TIME": "2000"}


def assert_all_ok(run, n):
    assert run.returncode == 0, run
    for r in range(n):
        assert f"rank {r}: OK" in run.stdout, run


@pytest.mark.timeout(150)
def test_bad_value_on_every_rank(ranks):
    run = ranks(2, "config_env.py", "all", timeout=LIMIT, env={"COMMLIB_FUSION_THRESHOLD": "abc"})
    assert_all_ok(run, 2)


@pytest.mark.timeout(150)
def test_bad_horovod_value_names_both_variables(ranks):
    run = ranks(2, "config_env.py", "horovod", timeout=LIMIT,
                env={"HOROVOD_FUSION_THRESHOLD": "abc", "COMMLIB_FUSION_THRESHOLD": ""})
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


@pytest.mark.timeout(150)
@pytest.mark.parametrize("fusion, mode", [("0", "unfused"), (None, "fused")])
def test_horovod_variables_read_as_commlib_ones(ranks, tmp_path, fusion, mode):
    """A Horovod job's HOROVOD_TIMELINE and HOROVOD_FUSION_THRESHOLD take
    effect (commlibrun forwards them; init reads them as COMMLIB_*)."""
    env = {"HOROVOD_TIMELINE": str(tmp_path / "horovod.json"), "COMMLIB_TIMELINE": "", **HOLD}
    if fusion is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = fusion
    assert_all_ok(ranks(2, "horovod_env.py", env["HOROVOD_TIMELINE"], mode, timeout=LIMIT, env=env), 2)


@pytest.mark.timeout(150)
def test_a_commlib_variable_wins_over_horovods(ranks, tmp_path):
    env = {"HOROVOD_TIMELINE": str(tmp_path / "horovod.json"),
           "COMMLIB_TIMELINE": str(tmp_path / "commlib.json"), "HOROVOD_FUSION_THRESHOLD": "0",
           "COMMLIB_FUSION_THRESHOLD": "67108864", **HOLD}
    assert_all_ok(ranks(2, "horovod_env.py", env["COMMLIB_TIMELINE"], "fused", timeout=LIMIT, env=env), 2)
    assert not (tmp_path / "horovod.json").exists()

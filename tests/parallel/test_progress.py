"""Progress of the engine: asynchronous requests complete with nobody
waiting, several threads may wait (and drive) at once, and a collective that
outlasts the waiter's spin budget is finished by the background thread
(workers/progress.py; every rank checks its own results)."""
import os

import pytest


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_engine_progress(ranks, n):
    run = ranks(n, "progress.py", timeout=120, env={"COMMLIB_SPIN_US": "200"})
    run.assert_ok(n)


@pytest.mark.timeout(100)
@pytest.mark.parametrize("mode", ["own", "shared"])
def test_waits_yield_at_once_where_ranks_share_cores(ranks, mode):
    """A core per rank (each pinned to its own CPU): waits look a few
    microseconds before they yield; ranks on one CPU: they yield at once."""
    if mode == "own" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    run = ranks(2, "wait_mode.py", mode, timeout=60)
    run.assert_ok(2)

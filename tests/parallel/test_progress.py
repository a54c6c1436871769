"""Progress of the engine: asynchronous requests complete with nobody
waiting, several threads may wait (and drive) at once, and a collective that
outlasts the waiter's spin budget is finished by the background thread
(workers/progress.py; every rank checks its own results)."""
import pytest


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_engine_progress(ranks, n):
    run = ranks(n, "progress.py", timeout=120, env={"COMMLIB_SPIN_US": "200"})
    run.assert_ok(n)

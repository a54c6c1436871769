"""Every ending is an ending (issue 33): a frozen rank ends the whole job,
with no process left; point-to-point needs no rank 0; every value of the
configuration table works or is refused. Each run has a timeout."""
import os
import re
import time

import pytest
from concurrent_jobs import in_background, started_together

TIMEOUT = 2  # COMMLIB_TIMEOUT of the frozen-rank runs


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_frozen(request, tmp, n, victim, mode):
    return in_background(request.getfixturevalue("ranks"), n, "frozen_rank.py", mode, str(victim),
                         str(tmp), timeout=60, env={"COMMLIB_TIMEOUT": str(TIMEOUT)})


# (the cases' jobs wait out the timeout together: each takes ~6 s and little CPU)
frozen_job = started_together("test_frozen_rank_ends_the_job", start_frozen, "frozen_job")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,victim,mode", [(2, 1, "allreduce"), (2, 1, "p2p"), (3, 1, "grouped"),
                                           (3, 2, "allreduce"), (3, 2, "p2p"),
                                           (2, 0, "allreduce"), (3, 0, "grouped")])  # (0: the coordinator)
def test_frozen_rank_ends_the_job(frozen_job, n, victim, mode):
    """Rank `victim` stops itself (SIGSTOP) before a request the others wait
    on: they raise CollectiveTimeoutError naming it, then abort MPI at exit
    instead of waiting for it in MPI_Finalize; the job ends non-zero within
    COMMLIB_TIMEOUT + 10 s of the freeze, every process of it gone."""
    run, tmp_path = frozen_job
    ended = run.ended
    assert run.returncode not in (0, 124), run.describe()
    for r in range(n):
        if r != victim:
            assert f"rank {r}: raised CollectiveTimeoutError" in run.stdout, run.describe()
    frozen_at = float((tmp_path / "frozen_at").read_text())
    assert ended - frozen_at < TIMEOUT + 10, (ended - frozen_at, run.describe())
    pids = [int(p.name.split(".")[1]) for p in tmp_path.glob("pid.*")]
    assert len(pids) == n
    deadline = time.monotonic() + 3  # (the launcher reaps what mpiexec killed)
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], run.describe()


@pytest.mark.timeout(120)
def test_point_to_point_after_rank_0_shut_down(ranks):
    """Rank 0 shuts down while rank 2 is stopped and rank 1's send to it
    waits: the send completes; then every message size between ranks 1 and
    2, every collective kind of the set {1, 2} checked against numpy, and
    collectives of the whole job or of the set {0, 1} raise
    NotInitializedError naming rank 0 (see workers/p2p_without_rank0.py)."""
    ranks(3, "p2p_without_rank0.py", timeout=60).assert_ok(3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case,env", [("trio", {"COMMLIB_CACHE_CAPACITY": "0"}), ("pair", {})],
                         ids=["trio-without-order-log", "pair-with-order-log"])
def test_set_without_rank_0_after_rank_0_shut_down(ranks, case, env):
    """4 ranks, rank 0 shuts down at once: collectives of the set {1, 2, 3}
    (or {1, 2}, rank 3 idle in no such set while 300 collectives go round
    the order log) work, checked against numpy; the whole job's fail at once
    naming rank 0; rank 0's shutdown() returns once the set has shut down."""
    run = ranks(4, "set_without_rank0.py", case, timeout=90, env=env)
    run.assert_ok(4)
    returned = float(re.search(r"rank 0: shutdown\(\) returned at ([\d.]+)", run.stdout).group(1))
    called = [float(t) for t in re.findall(r"rank [123]: shutdown\(\) called at ([\d.]+)", run.stdout)]
    assert len(called) == (3 if case == "trio" else 2) and returned > max(called), run.describe()


@pytest.mark.timeout(120)
def test_set_member_killed_after_rank_0_shut_down(ranks):
    """Rank 2 of the set {1, 2} SIGKILLs itself after rank 0 shut down: rank
    1 raises RankLostError naming it, rank 0's shutdown() returns, and the
    job ends (the victim's 137) well within the timeout."""
    start = time.monotonic()
    run = ranks(3, "set_without_rank0.py", "kill", timeout=60)
    assert time.monotonic() - start < 40, run.describe()
    assert run.returncode == 137, run.describe()
    assert "rank 1: RankLostError" in run.stdout, run.describe()
    assert "rank 0: shutdown() returned" in run.stdout, run.describe()


@pytest.mark.timeout(120)
def test_shm_fusion_bytes_zero(ranks):
    """COMMLIB_SHM_FUSION_BYTES=0 (no fusion region): every collective kind
    works (the first allgather used to spin forever)."""
    ranks(2, "config_bounds.py", "COMMLIB_SHM_FUSION_BYTES", timeout=60).assert_ok(2)


@pytest.mark.timeout(150)
def test_every_boundary_value_of_every_setting(ranks):
    """Each variable of the configuration table at its minimum, 0, maximum
    and every choice: init(), every collective kind and a send/recv checked
    against numpy, shutdown(); just outside its range: ValueError naming it."""
    ranks(2, "config_bounds.py", timeout=120).assert_ok(2)

"""One process, no MPI: the commit files of commlib.elastic (atomic write,
header checks, choosing the newest commit every rank holds), the in-memory
commit/restore of a State, and commlibrun's restart loop
(commlib.launch.restarts.run_with_restarts)."""
import io
import os

import numpy as np
import pytest

from commlib import elastic
from commlib.elastic import CommitStore, ElasticStateError, newest_common
from commlib.launch.restarts import Attempt, run_with_restarts


def test_newest_common():
    assert newest_common([[1, 2, 3], [2, 3], [1, 3, 4]]) == 3
    assert newest_common([[1, 2], [2, 3]]) == 2  # rank 0 never finished 3
    assert newest_common([[1], [2]]) is None
    assert newest_common([[], [1]]) is None
    assert newest_common([]) is None


def test_write_atomic_replaces_whole_file(tmp_path):
    path = tmp_path / "f"
    elastic.write_atomic(str(path), b"old")
    elastic.write_atomic(str(path), b"new contents")
    assert path.read_bytes() == b"new contents"
    assert os.listdir(tmp_path) == ["f"]  # no temporary file left


def test_store_round_trip_and_pruning(tmp_path):
    store = CommitStore(str(tmp_path), rank=1, size=2)
    for n in (1, 2, 3):
        store.write(n, f"payload {n}".encode())
    (tmp_path / "rank1" / ".commit-0000000004.tmp123").write_bytes(b"torn")
    assert store.numbers() == [1, 2, 3]
    assert os.listdir(tmp_path / "rank1").count(".commit-0000000004.tmp123") == 0
    assert store.load(2) == b"payload 2" and store.written_by(3) == 2
    store.remove_except(2, older_only=True)
    assert store.numbers() == [2, 3]
    store.remove_except(2, older_only=False)
    assert store.numbers() == [2]
    store.remove_except(None, older_only=False)
    assert store.numbers() == []


@pytest.mark.parametrize("damage", ["truncate", "flip", "magic"])
def test_damaged_commit_is_refused(tmp_path, damage):
    store = CommitStore(str(tmp_path), rank=0, size=2)
    store.write(5, b"x" * 100)
    path = tmp_path / "rank0" / "commit-0000000005"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-10]
    elif damage == "flip":
        data[-1] ^= 1
    else:
        data[:5] = b"XXXXX"
    path.write_bytes(bytes(data))
    with pytest.raises(ElasticStateError, match="commit-0000000005 is damaged"):
        store.load(5)


def test_commit_of_another_job_size_is_refused(tmp_path):
    CommitStore(str(tmp_path), rank=0, size=3).write(1, b"p")
    store = CommitStore(str(tmp_path), rank=0, size=2)
    assert store.written_by(1) == 3
    with pytest.raises(ElasticStateError, match="of a 3-rank job, this job has 2 ranks"):
        store.load(1)


def test_object_state_commit_and_restore_in_memory(monkeypatch):
    monkeypatch.delenv(elastic.ELASTIC_DIR_ENV, raising=False)
    state = elastic.ObjectState(epoch=0, weights=np.zeros(3))
    state.weights += 1
    state.restore()  # back to the state at creation
    assert state.epoch == 0 and not state.weights.any()
    state.epoch, state.weights = 2, np.arange(3.0)
    state.commit()  # no directory: in memory only, no collective
    state.weights[:] = -1  # changed in place after the commit
    state.epoch = 3
    state.restore()
    assert state.epoch == 2 and state.weights.tolist() == [0.0, 1.0, 2.0]
    assert state.commit_number == 0


def test_run_needs_a_state():
    with pytest.raises(TypeError, match="must be an elastic State"):
        elastic.run(lambda s: None)({"epoch": 0})


def _attempts(*results):
    calls = []

    def attempt(number, left):
        calls.append((number, left))
        return results[number]

    return attempt, calls


def test_restarts_until_success():
    fail = Attempt(137, "rank 1 was killed by signal SIGKILL (first failure)")
    attempt, calls = _attempts(fail, fail, Attempt(0))
    out = io.StringIO()
    assert run_with_restarts(attempt, 3, out=out) == 0
    assert [c[0] for c in calls] == [0, 1, 2]
    text = out.getvalue()
    assert text.count("commlibrun: job failed: rank 1 was killed by signal SIGKILL") == 2
    assert "commlibrun: restart 1 of 3 after rank 1 was killed by signal SIGKILL" in text
    assert "commlibrun: restart 2 of 3 after" in text and "restart 3" not in text
    assert "giving up" not in text


def test_restarts_used_up():
    attempt, calls = _attempts(*[Attempt(3, "rank 0 exited with code 3 (first failure)")] * 3)
    out = io.StringIO()
    assert run_with_restarts(attempt, 2, out=out) == 3
    assert len(calls) == 3
    assert ("commlibrun: giving up: the job failed 3 times (2 restarts allowed); last cause: "
            "rank 0 exited with code 3 (first failure)") in out.getvalue()


def test_no_restart_after_timeout_or_interrupt():
    attempt, calls = _attempts(Attempt(124, retryable=False))
    out = io.StringIO()
    assert run_with_restarts(attempt, 3, out=out) == 124
    assert len(calls) == 1 and "restart" not in out.getvalue()


def test_timeout_covers_all_attempts():
    now = [0.0]

    def attempt(number, left):
        seen.append(left)
        now[0] += 30  # each attempt runs 30 s, then fails
        return Attempt(1, "rank 0 exited with code 1 (first failure)")

    seen = []
    run_with_restarts(attempt, 2, timeout=100, out=io.StringIO(), clock=lambda: now[0])
    assert seen == [100, 70, 40]

"""The timeline (COMMLIB_TIMELINE, start_timeline/stop_timeline): each rank's
Chrome-trace file holds the phases of every tensor (workers/timeline.py
checks them on every rank); the merged trace has every rank's events."""
import json

import pytest

from commlib.timeline import load_events, merge, rank_files


def check_merged(path, n):
    files = rank_files(str(path))
    assert len(files) == n, files
    merged = merge(str(path))
    with open(merged, encoding="utf-8") as f:
        events = json.load(f)
    assert {e["pid"] for e in events} == set(range(n))
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {f"rank {r}" for r in range(n)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_timeline_started_at_run_time(ranks, tmp_path, n):
    path = tmp_path / "trace.json"
    ranks(n, "timeline.py", str(path), "api", timeout=90).assert_ok(n)
    check_merged(path, n)


@pytest.mark.timeout(120)
def test_timeline_from_the_environment(ranks, tmp_path):
    path = tmp_path / "env_trace.json"
    ranks(2, "timeline.py", str(path), "env", timeout=90, env={"COMMLIB_TIMELINE": str(path)}).assert_ok(2)
    check_merged(path, 2)


def test_unclosed_file_loads(tmp_path):
    # A rank killed before closing its file leaves the array open (Chrome accepts that).
    p = tmp_path / "t.json"
    p.write_text('[\n{"name": "a", "ph": "i", "pid": 0, "tid": 0, "ts": 1},\n')
    assert load_events(str(p)) == [{"name": "a", "ph": "i", "pid": 0, "tid": 0, "ts": 1}]
    assert rank_files(str(p)) == [str(p)]
    with pytest.raises(FileNotFoundError):
        merge(str(tmp_path / "missing.json"))

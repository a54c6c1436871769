"""``python -m commlib.timeline phases``: each rank's spans by phase, in the
order each phase first started, with counts, total and longest time, and the
tensors of the longest spans (how a GPU run's first step is read)."""
import json

from commlib.timeline import main, phases


def trace():
    meta = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": n}}
            for t, n in ((1, "nccl_communicator.set0"), (2, "grad.a"), (3, "grad.b"))]
    spans = [("NCCL_INIT", 1, 1000, 1_200_000), ("NEGOTIATE", 2, 500, 1_300_000), ("NEGOTIATE", 3, 800, 2_000),
             ("allreduce", 2, 1_301_000, 30_000), ("allreduce", 3, 1_301_000, 45_000)]
    return meta + [{"name": p, "ph": "X", "pid": 0, "tid": t, "ts": ts, "dur": d, "args": {}}
                   for p, t, ts, d in spans]


def test_phases_table():
    lines = phases(trace(), longest=1)
    assert lines[0].split()[:3] == ["phase", "spans", "total"]
    assert [ln.split()[0] for ln in lines[1:]] == ["NEGOTIATE", "NCCL_INIT", "allreduce"]
    negotiate, init, run = (ln.split() for ln in lines[1:])
    assert negotiate[1:6] == ["2", "1302.0", "1300.0", "0.0", "1300.0"] and negotiate[6] == "grad.a"
    assert init[1:4] == ["1", "1200.0", "1200.0"] and init[6] == "nccl_communicator.set0"
    assert run[1:4] == ["2", "75.0", "45.0"] and run[6] == "grad.b"
    assert phases([{"name": "CACHE_HIT", "ph": "i", "ts": 1}]) == ["(no spans)"]


def test_phases_command(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace()))
    (tmp_path / "t.rank1.json").write_text(json.dumps(trace()[:3]))
    assert main(["phases", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("rank ") == 2 and "NCCL_INIT" in out and "(no spans)" in out
    assert main(["phases", str(tmp_path / "missing.json")]) == 1

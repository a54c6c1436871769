"""tests/gpu/check.sh, the one-call GPU check, on CPU: its plan (--dry-run)
holds every step the GPU machine must run, each under a limit, all within
8 minutes; its CPU part runs and writes a report with the benchmark's table
and a summary; a spent budget skips steps instead of overrunning."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "check.sh"


def check(*args, timeout=120):
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=str(ROOT))


def test_plan_has_every_step_within_eight_minutes(tmp_path):
    proc = check("--dry-run", "--wheels", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    steps = re.findall(r"^\[\s*(\d+)s\] ([^\t]+)\t(.*)$", proc.stdout, re.M)
    assert sum(int(limit) for limit, _, _ in steps) <= 480, steps
    plan = {name: cmd for _, name, cmd in steps}
    joined = "\n".join(f"{name}: {cmd}" for name, cmd in plan.items())
    assert "--no-index --no-deps --target" in joined and "--no-build-isolation" in joined, joined
    assert any(name.startswith("tests/gpu") and "pytest" in cmd and "tests/gpu" in cmd for name, cmd in plan.items()), joined
    for n in (2, 4):
        assert f"-np {n} " in plan[f"CUDA bench, {n} ranks"] and "--device cuda" in plan[f"CUDA bench, {n} ranks"]
    compare = [cmd for name, cmd in plan.items() if "against DDP, 2 ranks" in name]
    assert compare and "rank_env.sh" in compare[0] and "--compare --device cuda --model" in compare[0], joined
    trace = re.search(r"COMMLIB_TIMELINE=(\S+)", compare[0])
    phases = [cmd for name, cmd in plan.items() if name.endswith("timeline by phase")]
    assert trace and phases and phases[0].endswith(f"-m commlib.timeline phases {trace.group(1)}"), joined
    for n in (4, 8, 16):
        cmd = plan[f"CPU scale: allreduce, alltoall and allgather against MPI, {n} ranks"]
        assert cmd.startswith("env CUDA_VISIBLE_DEVICES= ") and f"-np {n} " in cmd, cmd
    assert not list(tmp_path.iterdir()), "a dry run writes nothing"


@pytest.mark.timeout(200)
def test_cpu_part_writes_one_report(tmp_path):
    report = tmp_path / "report.md"
    proc = check("--cpu-only", "--ranks", "2", "--report", str(report), "--cpu-bench-args",
                 "--ops allreduce --min-bytes 4K --max-bytes 64K --factor 16 --iters 5 --warmup 1", timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr + (report.read_text() if report.exists() else "")
    text = report.read_text()
    assert text.startswith("# commlib GPU check, "), text[:200]
    assert "## CPU scale: allreduce, alltoall and allgather against MPI, 2 ranks" in text, text
    assert re.search(r"^ok in \d+ s$", text, re.M), text
    assert re.search(r"^(\[0\]: )?allreduce\s+4 KiB", text, re.M), text  # (the benchmark's table)
    assert re.search(r"^\| CPU scale: .*, 2 ranks \| ok \| \d+ \|$", text, re.M), text


def test_spent_budget_skips_steps(tmp_path):
    report = tmp_path / "report.md"
    proc = check("--cpu-only", "--ranks", "2 4", "--report", str(report), "--budget", "3")
    assert proc.returncode == 0, proc.stderr
    text = report.read_text()
    assert text.count("**skipped**") == 2, text
    assert re.search(r"^\| CPU scale: .*, 4 ranks \| skipped \| 0 \|$", text, re.M), text

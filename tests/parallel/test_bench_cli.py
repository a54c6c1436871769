"""The benchmark CLI runs end to end at 2 ranks (a few small sizes) and
prints its table and the fusion lines with ratios. It checks that the CLI
works, not how fast anything is."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(200)
def test_bench_cli_prints_tables_and_fusion_cases():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "commlib.launch", "-np", "2", "--timeout", "150", sys.executable, "-m",
           "commlib.bench", "--ops", "allreduce,allgather,reducescatter", "--max-bytes", "4K", "--no-gloo"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=str(ROOT))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    for op in ("allreduce", "allgather", "reducescatter"):
        rows = re.findall(rf"^\[0\]: {op}\s+\S+ \S+\s+([\d.]+)", out, re.M)
        assert len(rows) >= 3, f"no {op} rows in:\n{out}"
    assert re.search(r"fusion, 128 x 4 KiB allreduce: .*\(ratio [\d.]+\)", out), out
    assert re.search(r"fusion, 128 x 4 KiB allgather_async .*\(ratio [\d.]+\), into given outs .*"
                     r"\(ratio [\d.]+\) .*; 128 reducescatter_async .*\(ratio [\d.]+\)", out), out

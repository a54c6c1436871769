"""The own all-reduce algorithms (ring, tree) and MPI's, selected with
COMMLIB_ALLREDUCE_ALGO, against numpy on 2, 3, 4 and 5 ranks.

Each test is one launch of tests/parallel/workers/algo_allreduce.py, which
batches every dtype x op x size case and then checks that all ranks hold
bitwise identical results (see the worker's docstring).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def launch(ranks, n, *args, algo):
    run = ranks(n, "algo_allreduce.py", *args, timeout=90, env={"COMMLIB_ALLREDUCE_ALGO": algo})
    return run.returncode, run.stdout, run.stderr


def assert_ok(n, rc, out, err):
    failed = [line for line in err.splitlines() if "FAILED" in line]
    report = (f"exit code {rc}; {len(failed)} FAILED lines (first 30):\n" + "\n".join(failed[:30]) +
              f"\n--- stdout ---\n{out[-3000:]}\n--- stderr ---\n{err[-3000:]}")
    assert rc == 0 and not failed, report
    missing = [r for r in range(n) if f"rank {r}: OK" not in out]
    assert not missing, f"ranks {missing} did not finish\n" + report


@pytest.mark.timeout(150)
# (MPI's own algorithm at 2 and 3 ranks: commlib maps dtypes and ops, MPI reduces)
@pytest.mark.parametrize("algo,n", [(a, n) for a in ("ring", "tree", "mpi") for n in (2, 3, 4) if (a, n) != ("mpi", 4)])
def test_allreduce_algo_matches_numpy(ranks, algo, n):
    """Every dtype (uint8, int8, int32, int64, float16, float32, float64,
    bool, bfloat16 if ml_dtypes is installed) x op (Sum, Min, Max, Product,
    Average except for bool) x size (0, 1, ranks-1, ranks+1, 1000, 1_000_003
    elements), plus order-sensitive float32 sums and signed-zero Min/Max;
    results bitwise identical on all ranks."""
    assert_ok(n, *launch(ranks, n, algo=algo))


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,algo", [(5, "ring"), (5, "tree"), (3, "auto"), (3, "shm")])
def test_allreduce_algo_quick(ranks, algo, n):
    """5 ranks (recursive doubling with one rank folded in; a ring of 5) and
    the automatic choice, with smaller sizes."""
    assert_ok(n, *launch(ranks, n, "quick", algo=algo))


@pytest.mark.timeout(60)
def test_unknown_algo_is_rejected():
    code = ("import commlib\n"
            "try:\n"
            "    commlib.init()\n"
            "except ValueError as e:\n"
            "    print('rejected:', e)\n")
    env = dict(os.environ, COMMLIB_ALLREDUCE_ALGO="bogus",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=50, cwd=str(ROOT))
    assert "rejected:" in proc.stdout, proc.stdout + proc.stderr
    assert "auto, shm, ring, tree, mpi" in proc.stdout

"""Shared test helpers: running a worker script on N ranks under a timeout."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "parallel" / "workers"


class RankRun:
    def __init__(self, proc: subprocess.CompletedProcess, started: float):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.ended = time.time()  # (when the job ended, for tests that time it)
        self.seconds = self.ended - started

    def __repr__(self) -> str:
        return f"<rc={self.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}>"

    def describe(self, limit: int = 6000) -> str:
        """The job's exit code and the ends of its output, whole (pytest
        shortens an assertion's message, which hid which rank failed how)."""
        return (f"exit code {self.returncode}\n--- stdout (last {limit} chars) ---\n{self.stdout[-limit:]}"
                f"\n--- stderr (last {limit} chars) ---\n{self.stderr[-limit:]}")

    def assert_script_ok(self, script: str, n: int) -> None:
        """``script`` ran to its end on each of ranks 0..n-1 in a job of
        workers/in_one_job.py (which prints "rank R: SCRIPT[:ARGS] OK" after it;
        ``script`` as given there)."""
        missing = [r for r in range(n) if f"rank {r}: {script} OK" not in self.stdout]
        if missing:
            pytest.fail(f"{script} did not end on ranks {missing} (exit code {self.returncode})\n"
                        + self.describe(), pytrace=False)

    def assert_ok(self, n: int) -> None:
        """The job succeeded and each of ranks 0..n-1 printed "rank R: OK"
        (the last line of a worker whose checks all passed)."""
        if self.returncode != 0:
            pytest.fail(self.describe(), pytrace=False)
        missing = [r for r in range(n) if f"rank {r}: OK" not in self.stdout]
        if missing:
            pytest.fail(f"ranks {missing} did not print their OK line\n" + self.describe(), pytrace=False)


@functools.cache
def session_mpiexec() -> str:
    """The launcher commlibrun finds for this interpreter, found once per
    session: the search runs a probe interpreter and each candidate's
    ``--version`` (about 0.5 s a job; tests/unit/test_launcher*.py test it)."""
    from commlib.launch.mpi_discovery import find_mpiexec

    return find_mpiexec(python=sys.executable)


def run_ranks(np_: int, script: str, *args: str, timeout: float = 120, env: dict | None = None,
              launcher_args: tuple = ()) -> RankRun:
    """Runs tests/parallel/workers/<script> on np_ ranks through commlibrun.

    A hang becomes a test failure: the launcher kills the whole job after
    ``timeout`` seconds, and subprocess gives it 30 s more to clean up.
    """
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")])
    full_env.setdefault("COMMLIB_STALL_CHECK_TIME", "30")
    full_env.setdefault("COMMLIB_MPIEXEC", session_mpiexec())
    if env:
        full_env.update(env)
    cmd = [sys.executable, "-m", "commlib.launch", "-np", str(np_), "--timeout", str(timeout),
           *launcher_args, sys.executable, str(WORKERS / script), *args]
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30, env=full_env,
                          cwd=str(ROOT))
    return RankRun(proc, started)


@pytest.fixture(scope="session")
def ranks():
    """run_ranks (session-scoped, so that module fixtures may run jobs too)."""
    return run_ranks


def _load(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def gpu_emulator(tmp_path_factory) -> dict:
    """The environment that runs commlib's NCCL executor against the GPU
    emulator (tests/gpu_emulator/build.py), built once per session."""
    try:
        build_core = _load("commlib_build_core", ROOT / "bindings" / "build_core.py")
        cxx = build_core.cxx_compiler()
    except RuntimeError as exc:  # no MPI compiler wrapper: the core cannot be built either
        pytest.skip(f"no toolchain: {exc}")
    if not cxx:
        pytest.skip("no C++ compiler")
    emulator = _load("commlib_gpu_emulator_build", ROOT / "tests" / "gpu_emulator" / "build.py")
    return emulator.build(tmp_path_factory.mktemp("gpu_emulator"), cxx)

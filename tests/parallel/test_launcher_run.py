"""End-to-end tests of commlibrun with the installed MPI (2 and 3 ranks).

The rank programs use mpi4py, not commlib's core, so these tests only need
the launcher.  The launcher is run as ``python -m commlib.launch`` so the
console script does not have to be installed.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("mpi4py")

REPO = Path(__file__).resolve().parents[2]


def launcher_env(**extra):
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def write_script(tmp_path, body):
    path = tmp_path / "rank_prog.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def commlibrun(args, timeout=100, **extra_env):
    """Run commlibrun to completion; return (CompletedProcess, seconds taken)."""
    start = time.monotonic()
    cmd = [sys.executable, "-m", "commlib.launch", *args]
    with subprocess.Popen(cmd, env=launcher_env(**extra_env), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # SIGTERM, not SIGKILL: the launcher then stops its whole job, so
            # no rank outlives a failed test and loads the rest of the suite.
            proc.terminate()
            proc.communicate(timeout=30)
            raise
    out = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    return out, time.monotonic() - start


def processes_with(marker):
    """Pids of live (non-zombie) processes whose command line contains ``marker``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            pids.append(int(entry))
    return pids


def assert_no_leftovers(marker, timeout=10):
    deadline = time.monotonic() + timeout
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(marker) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("np", [2, 3])
def test_output_lines_prefixed_and_intact(tmp_path, np):
    # Each line is written in two pieces with a flush in between, the worst
    # case for tools that tag raw output chunks.
    prog = write_script(tmp_path, """
        import sys
        from mpi4py import MPI
        rank = MPI.COMM_WORLD.rank
        for i in range(200):
            line = f"rank {rank} line {i} " + "x" * 100 + " end\\n"
            sys.stdout.write(line[:40]); sys.stdout.flush(); sys.stdout.write(line[40:])
            if i % 50 == 0:
                print(f"rank {rank} err {i}", file=sys.stderr)
    """)
    out, _ = commlibrun(["-np", str(np), sys.executable, prog])
    assert out.returncode == 0, out.stderr
    pattern = re.compile(r"\[(\d+)\]: rank \1 line (\d+) x{100} end")
    seen = {r: [] for r in range(np)}
    for line in out.stdout.splitlines():
        m = pattern.fullmatch(line)
        assert m, f"garbled or unprefixed line: {line!r}"
        seen[int(m.group(1))].append(int(m.group(2)))
    assert seen == {r: list(range(200)) for r in range(np)}
    err_lines = [line for line in out.stderr.splitlines() if " err " in line]
    assert sorted(err_lines) == sorted(f"[{r}]: rank {r} err {i}" for r in range(np) for i in (0, 50, 100, 150))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("np", [2, 3])
def test_env_forwarded_and_args_unchanged(tmp_path, np):
    prog = write_script(tmp_path, """
        import json, os, sys
        from mpi4py import MPI
        print(json.dumps([MPI.COMM_WORLD.rank, os.environ.get("COMMLIB_FOO"),
                          os.environ.get("EXTRA_VAR"), sys.argv[1:]]))
    """)
    args = ["a b", "it's", '"q"', "$HOME", "x;echo no", "*", ""]
    out, _ = commlibrun(["-np", str(np), "-x", "EXTRA_VAR=e v", sys.executable, prog, *args],
                        COMMLIB_FOO="foo bar")
    assert out.returncode == 0, out.stderr
    results = sorted(json.loads(line.split(": ", 1)[1]) for line in out.stdout.splitlines())
    assert results == [[r, "foo bar", "e v", args] for r in range(np)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("np", [2, 3])
def test_bind_cores_pins_each_rank_and_its_threads_to_its_own_cpus(tmp_path, np):
    from commlib.launch._rankwrap import core_block

    prog = write_script(tmp_path, """
        import json, os, threading
        from mpi4py import MPI
        seen = []
        t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))
        t.start(); t.join()
        print(json.dumps([MPI.COMM_WORLD.rank, sorted(os.sched_getaffinity(0)), seen[0]]))
    """)
    cpus = sorted(os.sched_getaffinity(0))
    for args, pinned in ((["--bind-cores"], True), ([], False)):
        out, _ = commlibrun([*args, "-np", str(np), sys.executable, prog])
        assert out.returncode == 0, out.stderr
        got = sorted(json.loads(line.split(": ", 1)[1]) for line in out.stdout.splitlines())
        # (more ranks than CPUs, as 3 on 2, leaves every rank on all of them)
        want = [(core_block(cpus, r, np) if pinned else None) or cpus for r in range(np)]
        assert got == [[r, want[r], want[r]] for r in range(np)], (args, out.stdout)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("np", [2, 3])
def test_exit_code_of_failing_rank(tmp_path, np):
    prog = write_script(tmp_path, """
        import sys, time
        from mpi4py import MPI
        MPI.COMM_WORLD.Barrier()
        if MPI.COMM_WORLD.rank == 1:
            sys.exit(3)
        time.sleep(1)
    """)
    out, _ = commlibrun(["-np", str(np), sys.executable, prog])
    assert out.returncode == 3, out.stderr
    assert "commlibrun: rank 1 exited with code 3" in out.stderr
    assert "commlibrun: job failed: rank 1 exited with code 3 (first failure)" in out.stderr


@pytest.mark.timeout(120)
def test_a_program_that_does_not_exist_is_named_on_every_rank(tmp_path):
    missing = str(tmp_path / "no_such_program")
    out, _ = commlibrun(["-np", "2", missing])
    assert out.returncode == 127, out
    for r in range(2):
        assert f"commlibrun: rank {r} on host" in out.stderr and f"cannot run {missing!r}" in out.stderr, out
    assert "Traceback" not in out.stderr, out.stderr
    assert "exited with code 127 (first failure)" in out.stderr, out.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["raise", "exit"])
def test_failure_named_is_the_one_others_followed(tmp_path, how):
    # Rank 0 fails and is slow to exit (an atexit sleep that runs after
    # commlib's shutdown); its shutdown makes rank 1's allreduce fail at once,
    # and rank 1 exits first. commlibrun must still name rank 0.
    prog = write_script(tmp_path, f"""
        import atexit, os, sys, time
        import numpy as np
        if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK")) == "0":
            atexit.register(time.sleep, 2)  # (runs after commlib's own atexit shutdown)
        import commlib
        commlib.init()
        commlib.barrier()
        if commlib.rank() == 0:
            if "{how}" == "raise":
                raise RuntimeError("rank 0 fails")
            sys.exit(3)
        commlib.allreduce(np.ones(2), name="never")
    """)
    out, _ = commlibrun(["-np", "2", sys.executable, prog])
    code = 1 if how == "raise" else 3
    assert "NotInitializedError" in out.stderr, out.stderr
    assert f"commlibrun: job failed: rank 0 exited with code {code} (first failure)" in out.stderr, out.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("np", [2, 3])
def test_rank_killed_by_sigkill_ends_job(tmp_path, np):
    marker = uuid.uuid4().hex
    prog = write_script(tmp_path, """
        import os, signal, sys, time
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        comm.Barrier()
        if comm.rank == 1:
            time.sleep(1)
            os.kill(os.getpid(), signal.SIGKILL)
        comm.Barrier()  # the other ranks wait here for the dead rank
    """)
    out, elapsed = commlibrun(["-np", str(np), sys.executable, prog, marker])
    assert elapsed < 60
    assert out.returncode == 137, out.stderr
    assert re.search(r"commlibrun: rank 1 \(pid \d+ on host \S+\) was killed by signal SIGKILL", out.stderr)
    assert "commlibrun: job failed: rank 1 was killed by signal SIGKILL (first failure)" in out.stderr
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
def test_timeout_kills_job(tmp_path):
    marker = uuid.uuid4().hex
    prog = write_script(tmp_path, """
        import time
        from mpi4py import MPI
        MPI.COMM_WORLD.Barrier()
        while True:
            time.sleep(1)
    """)
    out, elapsed = commlibrun(["-np", "2", "--timeout", "5", sys.executable, prog, marker])
    assert elapsed < 30
    assert out.returncode != 0
    assert "commlibrun: timeout: job still running after 5 s" in out.stderr
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
def test_timeout_shows_where_each_rank_is_stuck(tmp_path):
    # A job stuck after commlib.init(): before stopping it, commlibrun has
    # every rank write its threads' Python stacks (commlib.stack_dumps), so
    # the output names the function each rank hangs in, and its engine's
    # state (commlib.engine_state(): rank 0 waits for an allreduce rank 1
    # never submits). Rank 1 handles SIGUSR2 itself: its handler stays and
    # it is not asked.
    marker = uuid.uuid4().hex
    prog = write_script(tmp_path, """
        import signal, sys, time
        import commlib
        if commlib.__name__ and int(__import__("os").environ.get("OMPI_COMM_WORLD_RANK",
                                    __import__("os").environ.get("PMI_RANK", "0"))) == 1:
            signal.signal(signal.SIGUSR2, lambda *a: print("OWN HANDLER RAN", flush=True))
        commlib.init()

        def stuck_in_here_on(rank):
            print(f"stuck {rank}", flush=True)
            if rank == 0:
                import numpy as np
                commlib.allreduce(np.ones(4, np.float32), name="never.submitted.by.rank.1")
            while True:
                time.sleep(0.1)

        stuck_in_here_on(commlib.rank())
    """)
    out, elapsed = commlibrun(["-np", "2", "--timeout", "8", sys.executable, prog, marker])
    assert elapsed < 40
    assert out.returncode != 0
    assert ("commlibrun: timeout: job still running after 8 s, killing it after the Python stacks of its "
            "1 rank process(es) on this host, which follow") in out.stderr, out.stderr
    # (faulthandler's frames read 'line N in f'; rank 1's KeyboardInterrupt at the stop reads 'line N, in f')
    stacks = [line for line in out.stderr.splitlines() if re.search(r"line \d+ in stuck_in_here_on", line)]
    assert stacks and all(line.startswith("[0]: ") for line in stacks), out.stderr
    assert ("[0]: commlib (rank 0): engine: 1 requests open (0 point-to-point), 0 held for batching, "
            "0 CUDA launches in flight") in out.stderr, out.stderr
    assert "engine:" not in out.stderr.replace("[0]: commlib (rank 0): engine:", ""), out.stderr
    assert "OWN HANDLER RAN" not in out.stdout
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
def test_sigint_to_launcher_stops_job(tmp_path):
    marker = uuid.uuid4().hex
    prog = write_script(tmp_path, """
        import time
        from mpi4py import MPI
        MPI.COMM_WORLD.Barrier()
        print("ready", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-m", "commlib.launch", "-np", "2", sys.executable, prog, marker],
                            env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().endswith("ready\n")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGINT
    assert "commlibrun: interrupted by SIGINT" in err
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
def test_program_found_on_callers_path(tmp_path):
    """The ranks run the program that the caller's PATH finds first, by its
    absolute path, even when the MPI launcher puts its own directory first on
    the ranks' PATH, as Open MPI's mpirun started by its absolute path does
    (here a wrapper around the installed mpiexec plays that part, and a
    ``python3`` shim in that directory comes after the caller's on PATH)."""
    from commlib.launch.launcher import find_mpiexec

    caller_bin, mpi_bin = tmp_path / "venv" / "bin", tmp_path / "mpi" / "bin"
    for directory, label in ((caller_bin, "caller"), (mpi_bin, "launcher")):
        directory.mkdir(parents=True)
        shim = directory / "python3"
        shim.write_text(f'#!/bin/sh\necho "{label} python3 ran as $0"\nexec "{sys.executable}" "$@"\n')
        shim.chmod(0o755)
    real_mpiexec = find_mpiexec(dict(os.environ), python=sys.executable)
    wrapper = tmp_path / "mpiexec"
    wrapper.write_text(f'#!/bin/sh\nPATH="{mpi_bin}:$PATH"\nexport PATH\n'
                       f'exec "{os.path.abspath(real_mpiexec)}" "$@"\n')
    wrapper.chmod(0o755)
    path = os.pathsep.join([str(caller_bin), str(mpi_bin), os.environ.get("PATH", "")])
    out, _ = commlibrun(["-np", "2", "python3", "-c", "print('rank program done')"],
                        PATH=path, COMMLIB_MPIEXEC=str(wrapper))
    assert out.returncode == 0, out
    assert out.stdout.count(f"caller python3 ran as {caller_bin / 'python3'}") == 2, out
    assert "launcher python3" not in out.stdout, out
    assert out.stdout.count("rank program done") == 2, out

"""commlibrun leaves nothing of a killed job on its host: no process (hydra's
proxies included, found by an environment marker the test passes down) and
no shared-memory segment in /dev/shm (the ones the job's processes were seen
to use, and commlib's, named after the job's token). Ranks use commlib."""

import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from job_watch import job_env, marked, shm_in_use

# The names of the MPI's own segments: MPICH's, Open MPI's
MPI_SEGMENTS = ("/dev/shm/mpich_shm_", "/dev/shm/vader_segment.")

RANK_PROG = """
    import os, signal, sys, time
    import commlib
    from commlib.launch.job_cleanup import shm_paths
    commlib.init()
    if sys.argv[1] == "end_at_once":  # (rank 1 killed, rank 0 gone without MPI_Finalize)
        print("segments", *sorted(shm_paths(os.getpid())), flush=True)
        os.kill(os.getpid(), signal.SIGKILL) if commlib.rank() == 1 else os._exit(3)
    print("ready", commlib.rank(), flush=True)
    if sys.argv[1] == "kill1" and commlib.rank() == 1:
        time.sleep(3)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
"""


class Watch:
    """Follows a job by its marker: its processes, its segments, its token."""

    def __init__(self, marker):
        self.marker, self.segments, self.token = marker, set(), None

    def look(self):
        for pid, environ in marked(self.marker).items():
            self.segments |= shm_in_use(pid)
            for item in environ:
                if item.startswith(b"COMMLIB_RUN_JOB="):
                    self.token = item.split(b"=", 1)[1].decode()
        return self

    def commlib_segments(self):
        return sorted(Path("/dev/shm").glob(f"commlib.{self.token}.*")) if self.token else []

    def assert_nothing_left(self, timeout=10):
        deadline = time.monotonic() + timeout
        while marked(self.marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in marked(self.marker)
                if Path(f"/proc/{pid}/comm").exists()}
        assert not left, f"processes of the job survive: {left}"
        assert self.segments, "the job was never seen using a segment"
        assert [s for s in self.segments if os.path.exists(s)] == []
        assert self.commlib_segments() == []


def start(tmp_path, np_, mode, *, prefix=(), **env):
    """commlibrun running RANK_PROG, and a Watch on its job."""
    marker = uuid.uuid4().hex
    prog = tmp_path / "rank_prog.py"
    prog.write_text(textwrap.dedent(RANK_PROG))
    cmd = [*prefix, sys.executable, "-m", "commlib.launch", "-np", str(np_), sys.executable, str(prog), mode]
    proc = subprocess.Popen(cmd, env=job_env(marker, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    return proc, Watch(marker)


def run_job(proc, watch, np_, act=None):
    """Waits for the np_ ranks' "ready", notes what the job uses, does act(),
    then waits for commlibrun; returns its stderr."""
    try:
        for _ in range(np_):
            line = proc.stdout.readline()
            assert "ready" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        watch.look()
        if act:
            act()
        return proc.communicate(timeout=90)[1]
    finally:
        proc.kill()


@pytest.mark.timeout(150)
def test_sigterm_to_commlibrun_leaves_nothing(tmp_path):
    proc, watch = start(tmp_path, 2, "sleep")
    err = run_job(proc, watch, 2, lambda: proc.send_signal(signal.SIGTERM))
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert any(MPI_SEGMENT in s for s in watch.segments for MPI_SEGMENT in MPI_SEGMENTS), watch.segments
    watch.assert_nothing_left()


@pytest.mark.timeout(150)
def test_rank_sigkilled_mid_job_leaves_nothing(tmp_path):
    proc, watch = start(tmp_path, 2, "kill1")
    err = run_job(proc, watch, 2)
    assert proc.returncode == 128 + signal.SIGKILL, err
    watch.assert_nothing_left()


@pytest.mark.timeout(150)
def test_job_that_ends_right_after_init_leaves_no_segment(tmp_path):
    """Ranks that end the moment init() is done (too soon for commlibrun's
    once-a-second look at the job's segments): the segments each rank
    reported at init are removed all the same."""
    proc, _ = start(tmp_path, 2, "end_at_once")
    out, err = proc.communicate(timeout=90)
    assert proc.returncode != 0, (out, err)
    used = {p for line in out.splitlines() if "segments" in line.split()  # ("[R]: segments PATH...")
            for p in line.split()[line.split().index("segments") + 1:]}
    assert any(MPI_SEGMENT in p for p in used for MPI_SEGMENT in MPI_SEGMENTS), (out, err)
    assert sorted(p for p in used if os.path.exists(p)) == [], err


@pytest.mark.timeout(150)
def test_timeout_around_commlibrun_leaves_nothing(tmp_path):
    """`timeout` sends SIGTERM to commlibrun alone; the job's proxy and ranks
    (in sessions of their own) go too, and MPICH's segments with them. The
    job expires 2 s after its ranks are up: SIGALRM is how coreutils'
    `timeout` expires (it then exits 124, as after its full duration)."""
    proc, watch = start(tmp_path, 3, "sleep", prefix=("timeout", "120"))
    err = run_job(proc, watch, 3, lambda: (time.sleep(2), proc.send_signal(signal.SIGALRM)))
    assert proc.returncode == 124, err
    watch.assert_nothing_left()


@pytest.mark.timeout(150)
def test_killed_during_init_leaves_no_segment(tmp_path):
    """A rank killed while local rank 0 holds a freshly created, still named
    segment (the named fallback, forced by the testing-only
    COMMLIB_TEST_SHM_NAMED; held open 20 s by COMMLIB_TEST_SHM_PAUSE_MS):
    the name is random, private (0600) and removed by commlibrun."""
    proc, watch = start(tmp_path, 2, "sleep", COMMLIB_TEST_SHM_PAUSE_MS="20000", COMMLIB_TEST_SHM_NAMED="1")
    marker = watch.marker
    try:
        deadline = time.monotonic() + 60
        while not watch.look().commlib_segments() and time.monotonic() < deadline:
            time.sleep(0.2)
        (segment,) = watch.commlib_segments()
        assert re.fullmatch(rf"commlib\.{watch.token}\.[0-9a-f]{{32}}\.0", segment.name), segment
        assert len(watch.token) == 32
        assert stat.S_IMODE(segment.stat().st_mode) == 0o600
        ranks = [pid for pid, env in marked(marker).items() if {b"PMI_RANK=1", b"OMPI_COMM_WORLD_RANK=1"} & set(env)
                 and Path(f"/proc/{pid}/cmdline").read_bytes().find(b"rank_prog.py") >= 0
                 and b"_rankwrap" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(ranks) == 1, ranks
        os.kill(ranks[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode != 0, err
    watch.assert_nothing_left()

"""commlib's shared segments have no name in /dev/shm (memfd_create on local
rank 0, opened by the others through /proc/<pid>/fd/<fd>): a job started by
plain mpiexec (no commlibrun to clean up after it) and SIGKILLed at any
moment of init() leaves no commlib.* entry. Where a rank cannot use the
unnamed segment, the host falls back to a named one, forced here by the
testing-only COMMLIB_TEST_SHM_NAMED, with the same results."""
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from job_watch import job_env, marked, shm_in_use

from commlib.launch.mpi_discovery import find_mpiexec

RANK_PROG = """
    import time
    import commlib
    print("start", flush=True)
    commlib.init()
    print("ready", flush=True)
    time.sleep(60)
"""
PAUSE_MS = 300  # (COMMLIB_TEST_SHM_PAUSE_MS: local rank 0 holds each new segment this long before handing it on)


def segments_made(marker, token):
    """Inodes of commlib's segments (unnamed, or named after token) that the job's processes hold."""
    ours = ("/memfd:commlib", f"/dev/shm/commlib.{token}.")
    inodes = set()
    for pid in marked(marker):
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith(ours):
                    inodes.add(int(fields[4]))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(ours):
                    inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            pass
    return inodes


def freeze_and_kill(marker):
    """SIGSTOPs every process of the job (until none is left running), notes
    the /dev/shm names they use, then SIGKILLs them all; returns the names."""
    stopped, names = set(), set()
    while True:
        fresh = set(marked(marker)) - stopped
        if not fresh:
            break
        for pid in fresh:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        for pid in fresh:  # wait until it is stopped (or gone): it writes nothing more
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except (OSError, IndexError):
                    break
                if state in "TtZX":
                    break
                time.sleep(0.005)
        stopped |= fresh
    for pid in stopped:
        names |= shm_in_use(pid)
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return names


def killed_job(tmp_path, n, when):
    """Starts RANK_PROG on n ranks under plain mpiexec (COMMLIB_RUN_JOB set by
    the test only to find commlib's names), waits until every rank is about
    to call init(), calls when(marker, token), then kills the whole job with
    SIGKILL. Returns (commlib's /dev/shm entries left, the names the job used)."""
    marker, token = uuid.uuid4().hex, uuid.uuid4().hex
    left = lambda: sorted(p.name for p in Path("/dev/shm").glob(f"commlib.{token}.*"))  # noqa: E731
    assert left() == []
    prog = tmp_path / "rank_prog.py"
    prog.write_text(textwrap.dedent(RANK_PROG))
    env = job_env(marker, COMMLIB_RUN_JOB=token, COMMLIB_TEST_SHM_PAUSE_MS=str(PAUSE_MS),
                  OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")  # (Open MPI's mpiexec as root)
    mpiexec = find_mpiexec(env, python=sys.executable)
    proc = subprocess.Popen([mpiexec, "-n", str(n), sys.executable, str(prog)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    used = set()
    try:
        seen = ""
        while seen.count("start") < n:  # (the ranks' lines may come interleaved)
            line = proc.stdout.readline()
            assert line, seen
            seen += line
        when(marker, token)
        used = freeze_and_kill(marker)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while marked(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not marked(marker), "processes of the job survive"
        return left(), used
    finally:
        proc.kill()
        proc.wait()
        for name in used | {f"/dev/shm/{name}" for name in left()}:  # (what SIGKILL left: MPICH's too)
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass


def after_segments_made(k):
    """Waits until the job holds its k-th segment: local rank 0 pauses PAUSE_MS
    right after making it, so that the kill falls in the window in which a
    named segment had its name."""
    def when(marker, token):
        deadline = time.monotonic() + 30
        while len(segments_made(marker, token)) < k:
            assert time.monotonic() < deadline, f"the job never held {k} segments"
            time.sleep(0.005)
    return when


def after(delay):
    return lambda marker, token: time.sleep(delay)


@pytest.mark.timeout(150)
def test_sigkill_during_init_leaves_nothing_in_dev_shm(tmp_path):
    """Killed the moment local rank 0 holds the first, then the second new
    segment (collectives', point-to-point's), then at three random moments
    of init() (about 1.2 s here with the pauses)."""
    rng = random.Random(33)
    whens = [after_segments_made(1), after_segments_made(2)] + [after(rng.uniform(0, 1.3)) for _ in range(3)]
    for i, when in enumerate(whens):
        left, used = killed_job(tmp_path, 2, when)
        assert left == [], f"try {i}: commlib's segments left in /dev/shm: {left}"
        assert not [u for u in used if "commlib" in u], f"try {i}: named segments in use: {used}"


@pytest.mark.timeout(300)
def test_named_fallback_gives_the_same_results(ranks):
    """3 ranks: allreduce, allgather, broadcast (every root) and sendrecv
    against numpy on the unnamed segments (what every rank maps by default),
    and on named ones when every rank forces them, or only the last rank
    (which then refuses to open rank 0's unnamed segment: all fall back)."""
    for mode, env in (("unnamed", {}), ("named-all", {"COMMLIB_TEST_SHM_NAMED": "1"}), ("named-last", {})):
        ranks(3, "shm_fallback.py", mode, env=env).assert_ok(3)

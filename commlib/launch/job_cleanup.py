"""What a ``commlibrun`` job leaves on the launcher's host: its processes and
its shared-memory segments, found and removed.

``commlibrun`` gives each job a random token in ``COMMLIB_RUN_JOB``; mpiexec,
hydra's proxies and the ranks inherit it, so every process of the job on this
host carries it in its environment (``/proc/<pid>/environ``), whatever
session or process group it moved to and whoever became its parent. The
core's segments have no name, except the fallback's, which carry the token
(``/dev/shm/commlib.<token>.*``);
MPICH's own segments (``/dev/shm/mpich_shm_*``) are learnt from the job's
processes' open files and mappings while they run, and from what each rank
reports itself once ``commlib.init()`` is done (``segments.<pid>`` in the
job's status folder: a job that dies within a second of its start is not
looked at in time). Only those names are ever removed: never another job's.

Standard library only (see commlib.launch.launcher).
"""

import glob
import os
import signal
import time

from ._rankwrap import STACKS_FILE_PREFIX, STACKS_SIGNAL

JOB_ENV = "COMMLIB_RUN_JOB"
SHM_DIR = "/dev/shm"
# Seconds between two looks at the job's processes' segments.
SCAN_SECONDS = 1.0
# A rank's report of its segments in the job's status folder: segments.<pid>
SEGMENTS_FILE_PREFIX = "segments."
# Rounds of stopping newly found processes before giving up (a proxy may be
# forking ranks while it is being stopped).
_STOP_ROUNDS = 50


def new_token():
    """A fresh job token: 128 random bits in hex."""
    return os.urandom(16).hex()


def job_processes(token):
    """Pids of live processes (other than this one) with ``COMMLIB_RUN_JOB=token``."""
    needle = f"{JOB_ENV}={token}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or another user's
            continue
        if needle in environ.split(b"\0"):  # (a zombie's environment reads empty)
            pids.append(int(entry))
    return pids


def _shm_path(path):
    return path.startswith(SHM_DIR + "/") and not path.endswith(" (deleted)")


def shm_paths(pid):
    """Names in /dev/shm that process ``pid`` has open or mapped and that still exist."""
    paths = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.rstrip("\n").split(None, 5)
                if len(fields) == 6 and _shm_path(fields[5]):
                    paths.add(fields[5])
    except OSError:
        pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if _shm_path(target):
                paths.add(target)
    except OSError:
        pass
    return paths


def report_segments(status_dir):
    """Writes the /dev/shm names this process uses to ``segments.<pid>`` in
    ``status_dir``, for the launcher's cleanup."""
    pid = os.getpid()
    paths = shm_paths(pid)
    if not paths:
        return
    final = os.path.join(status_dir, f"{SEGMENTS_FILE_PREFIX}{pid}")
    with open(final + ".part", "w") as f:  # (renamed whole: never read half written)
        f.write("".join(f"{p}\n" for p in sorted(paths)))
    os.replace(final + ".part", final)


def reported_segments(status_dir):
    """The /dev/shm names the job's ranks reported in ``status_dir``."""
    paths = set()
    try:
        names = [n for n in os.listdir(status_dir) if n.startswith(SEGMENTS_FILE_PREFIX)
                 and n[len(SEGMENTS_FILE_PREFIX):].isdigit()]
    except OSError:
        return paths
    for name in names:
        try:
            with open(os.path.join(status_dir, name)) as f:
                paths |= {p for p in f.read().splitlines() if _shm_path(p)}
        except OSError:
            continue
    return paths


def _signal(pid, signum):
    try:
        os.kill(pid, signum)
    except OSError:
        pass


class JobReaper:
    """Tracks one job's processes and segments on this host (by its token)."""

    def __init__(self, token=None):
        self.token = token or new_token()
        self.segments = set()
        self._scanned = None

    def note_segments(self, now=None):
        """Learn the segments the job's processes use (at most once a SCAN_SECONDS)."""
        now = time.monotonic() if now is None else now
        if self._scanned is not None and now - self._scanned < SCAN_SECONDS:
            return
        self._scanned = now
        for pid in job_processes(self.token):
            self.segments |= shm_paths(pid)

    def request_stacks(self, status_dir):
        """Sends STACKS_SIGNAL to the job's processes on this host that asked
        for it (a ``stacks.<pid>`` file in ``status_dir``, commlib.stack_dumps:
        their Python stacks to stderr); their pids."""
        try:
            pids = [n[len(STACKS_FILE_PREFIX):] for n in os.listdir(status_dir)
                    if n.startswith(STACKS_FILE_PREFIX)]
        except OSError:
            return []
        sent = sorted({int(p) for p in pids if p.isdigit()} & set(job_processes(self.token)))
        for pid in sent:
            _signal(pid, STACKS_SIGNAL)
        return sent

    def kill_all(self):
        """SIGKILL every process of the job; returns their pids. They are
        stopped first (a proxy then forks no more ranks) and their segments
        noted, so that none is created unseen between the look and the kill."""
        stopped = set()
        for _ in range(_STOP_ROUNDS):
            new = set(job_processes(self.token)) - stopped
            if not new:
                break
            for pid in new:
                _signal(pid, signal.SIGSTOP)
            stopped |= new
        for pid in stopped:
            self.segments |= shm_paths(pid)
        for pid in stopped:
            _signal(pid, signal.SIGKILL)
        return stopped

    def remove_segments(self, status_dir=None):
        """Unlink what the job left in /dev/shm (only files of this user),
        with what its ranks reported in ``status_dir``; returns the paths removed."""
        if status_dir:
            self.segments |= reported_segments(status_dir)
        paths = self.segments | set(glob.glob(os.path.join(SHM_DIR, f"commlib.{self.token}.*")))
        removed = []
        for path in sorted(paths):
            try:
                st = os.lstat(path)
                if st.st_uid == os.geteuid() and os.path.isfile(path) and not os.path.islink(path):
                    os.unlink(path)
                    removed.append(path)
            except OSError:
                continue
        return removed

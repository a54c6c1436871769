"""Following a job's processes from a test: the ones whose environment holds
TEST_JOB_MARKER=<marker> (mpiexec, hydra's proxies, the ranks), and the
shared-memory names they use."""
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def job_env(marker, **extra):
    """This environment with the job's marker, commlib importable from the repository."""
    env = dict(os.environ, TEST_JOB_MARKER=marker, **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def marked(marker):
    """{pid: environ entries} of live processes carrying TEST_JOB_MARKER=marker."""
    found = {}
    needle = f"TEST_JOB_MARKER={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in environ:
            found[int(entry)] = environ
    return found


def shm_in_use(pid):
    """/dev/shm names (not unlinked) that process pid has open or mapped."""
    names = set()
    try:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/") and not fields[5].endswith("(deleted)"):
                names.add(fields[5])
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("/dev/shm/") and not target.endswith("(deleted)"):
                names.add(target)
    except OSError:
        pass
    return names

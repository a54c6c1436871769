"""commlib's shared segments: names no other user can take first, and a size
that grows linearly with the ranks of a host."""
import os
import re
import subprocess

import pytest

# Small per-rank areas, so that a part growing with the square of the ranks
# would show (before: 1.9, 2.6 then 3.3 MiB more per rank from 2 to 5 ranks).
SMALL = {"COMMLIB_SHM_PIECE_BYTES": "65536", "COMMLIB_SHM_FUSION_BYTES": "65536"}


def segment_bytes(run, n):
    sizes = {int(m) for m in re.findall(r"rank \d+: segment bytes (\d+)", run.stdout)}
    assert len(sizes) == 1, run.describe()  # every rank maps the same segments
    return sizes.pop()


@pytest.mark.timeout(400)
def test_segment_size_grows_linearly(ranks):
    sizes = {}
    for n in (2, 3, 4, 5):
        run = ranks(n, "shm_segments.py", env=SMALL)
        run.assert_ok(n)
        sizes[n] = segment_bytes(run, n)
    steps = [sizes[n + 1] - sizes[n] for n in (2, 3, 4)]
    # The same step per added rank, up to the rounding of the rings' share
    # (64 bytes per ring) and their 128-byte headers.
    assert max(steps) - min(steps) <= 64 * 1024, (sizes, steps)


@pytest.mark.timeout(200)
def test_init_works_when_old_style_names_are_taken(ranks):
    """Someone created /dev/shm/commlib.<pid>.0 and .1 for the next pids (the
    names the pid-based scheme gave); commlib's random names do not collide."""
    pid_max = int(open("/proc/sys/kernel/pid_max").read())
    with subprocess.Popen(["true"]) as probe:  # the pid now being handed out
        first = probe.pid
    made = []
    try:
        for pid in range(first, first + 2000):
            for n in (0, 1):
                path = f"/dev/shm/commlib.{pid % pid_max}.{n}"
                try:
                    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
                    made.append(path)
                except FileExistsError:
                    pass
        run = ranks(2, "shm_segments.py")
    finally:
        for path in made:
            os.unlink(path)
    run.assert_ok(2)
    assert segment_bytes(run, 2) > 0

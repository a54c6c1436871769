"""Planned self-kills for the elastic restart tests.

``ELASTIC_KILLS="R:S:WHERE,..."`` lists kills: rank R SIGKILLs itself at
step S, where WHERE is

* ``step``: before computing step S;
* ``commit``: inside the first commit at or after step S, after writing half
  of its commit file's temporary copy (a torn write);
* ``aftercommit``: in that commit, right after its file was renamed into
  place, before the barrier that completes the commit.

Each kill happens once: its marker file ``<ELASTIC_MARKERS>/kill<i>``
(created exclusively) records ``<time.time()> <step>`` just before the kill;
the test reads them to measure the time from each kill to the first step of
the next attempt. The commit kills patch commlib.elastic.write_atomic.
"""
from __future__ import annotations

import os
import signal
import time

import commlib
from commlib import elastic as core_elastic

_KILLS = [tuple(k.split(":")) for k in os.environ.get("ELASTIC_KILLS", "").split(",") if k]
_MARKERS = os.environ.get("ELASTIC_MARKERS", "")
_step = [0]


def _die_if_due(where: str) -> None:
    step = _step[0]
    for i, (rank, at, kind) in enumerate(_KILLS):
        if int(rank) != commlib.rank() or kind != where:
            continue
        due = step == int(at) if where == "step" else step >= int(at)
        if not due:
            continue
        try:
            fd = os.open(os.path.join(_MARKERS, f"kill{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue  # this kill already happened in an earlier attempt
        os.write(fd, f"{time.time()!r} {step}\n".encode())
        os.fsync(fd)
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


def _write_atomic(path, data):
    if any(k[2] == "commit" for k in _KILLS):
        # A torn temporary file, as a kill in the middle of the write leaves it.
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(data[:len(data) // 2])
        _die_if_due("commit")
        os.remove(tmp)
    _real_write_atomic(path, data)
    _die_if_due("aftercommit")


_real_write_atomic = core_elastic.write_atomic
core_elastic.write_atomic = _write_atomic


def set_step(step: int) -> None:
    """The number of steps done so far (call before each commit)."""
    _step[0] = step


def at_step(step: int) -> None:
    """Call before computing step ``step`` (0-based: ``step`` steps are done)."""
    set_step(step)
    _die_if_due("step")


def process_start_time() -> float:
    """When this process started (time.time() scale), from /proc."""
    with open("/proc/stat") as f:
        boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return boot + ticks / os.sysconf("SC_CLK_TCK")


class FirstStep:
    """Prints, on rank 0, where a restarted attempt resumed, when its process
    started and when its first step was done."""

    def __init__(self, resumed_step: int):
        self.attempt = int(os.environ.get(core_elastic.RESTART_ENV, "0"))
        self.pending = self.attempt > 0 and commlib.rank() == 0
        if self.pending:
            print(f"attempt {self.attempt} resumed at step {resumed_step}", flush=True)
            print(f"attempt {self.attempt} started at {process_start_time()!r}", flush=True)

    def done(self) -> None:
        if self.pending:
            self.pending = False
            print(f"attempt {self.attempt} first step done at {time.time()!r}", flush=True)


def train_steps(state, steps: int, commit_every: int, step_fn) -> None:
    """The loop of the step-counting workers: ``step_fn(i)`` for each step
    ``state.step`` .. ``steps - 1``, a commit every ``commit_every`` steps,
    the planned kills on the way."""
    first = FirstStep(state.step)
    while state.step < steps:
        at_step(state.step)
        step_fn(state.step)
        state.step += 1
        first.done()
        if state.step % commit_every == 0:
            set_step(state.step)
            state.commit()

"""Helpers for worker scripts: every rank checks its own results and exits
non-zero with a message naming the rank and the failed check."""
from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import commlib


def fail(msg: str) -> None:
    print(f"rank {commlib.rank()}: FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def check_equal(got, want, what: str, rtol: float = 0.0, atol: float = 0.0) -> None:
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        fail(f"{what}: shape {got.shape} != expected {want.shape}")
    if got.dtype != want.dtype:
        fail(f"{what}: dtype {got.dtype} != expected {want.dtype}")
    g = got.astype(np.float64) if got.dtype.name == "bfloat16" else got
    w = want.astype(np.float64) if want.dtype.name == "bfloat16" else want
    if rtol == 0 and atol == 0:
        ok = np.array_equal(g, w)
    else:
        ok = np.allclose(g, w, rtol=rtol, atol=atol)
    if not ok:
        fail(f"{what}: got {got.ravel()[:8]} expected {want.ravel()[:8]}")


def expect_raises(exc_type, fn, what: str, match: str | None = None):
    try:
        fn()
    except exc_type as e:
        if match is not None and match not in str(e):
            fail(f"{what}: raised {exc_type.__name__} without {match!r}: {e}")
        return e
    except Exception as e:  # noqa: BLE001 - report the wrong type
        fail(f"{what}: expected {exc_type.__name__}, got {type(e).__name__}: {e}")
    fail(f"{what}: expected {exc_type.__name__}, nothing was raised")


def stop_process(pid: int, seconds: float = 10.0) -> None:
    """Sends SIGSTOP to pid and returns once every thread of it is stopped
    (kill() returns before the stop takes hold: on a loaded machine the
    process may otherwise run on for a while, even into the collective it
    should be frozen before)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + seconds
    while True:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:  # (a thread that just ended)
                continue
        if states and all(s in ("T", "t") for s in states):
            return
        if time.monotonic() > deadline:
            fail(f"pid {pid} not stopped {seconds:.0f} s after SIGSTOP (thread states {states})")
        time.sleep(0.001)


def done() -> None:
    print(f"rank {commlib.rank()}: OK", flush=True)


def init_even_odd(hvd):
    """Starts ``hvd`` (commlib.torch / commlib.tensorflow) with the even ranks
    as a static process set and adds the odd ranks as a dynamic one. Returns
    (even, odd, this rank's set, the other set)."""
    from mpi4py import MPI

    n = MPI.COMM_WORLD.Get_size()
    even = hvd.ProcessSet(list(range(0, n, 2)))
    hvd.init(process_sets=[even])
    odd = hvd.add_process_set(list(range(1, n, 2)))
    mine, other = (even, odd) if hvd.rank() % 2 == 0 else (odd, even)
    return even, odd, mine, other

"""Every boundary value of every COMMLIB_* variable works (2 ranks, one
process per rank): for each variable of commlib.config.table() and each of
its minimum, 0 (when allowed), maximum and every choice, the rank sets it,
calls init(), runs every collective kind and a send/recv pair against numpy
and shuts down; a hang ends the rank naming the variable and value. Values
just outside a range must make init() raise ValueError naming the variable.

Usage: config_bounds.py [NAME ...] (default: every variable)."""
import faulthandler
import os
import re
import sys
import threading
import time

import numpy as np

import commlib
import commlib.config
import _common
from _common import check_equal

PER_VALUE_S = 20  # a hang in one value ends the rank after this long
FUSION = 1 << 20  # bytes: the "larger" arrays exceed this, the fusion region and a piece
PAUSES_MS = {"COMMLIB_TEST_SHM_PAUSE_MS"}
# A piece of at most this many bytes per MPI call: the larger arrays (1 MiB)
# would take 130,000 calls each, minutes on a loaded machine; the small ones
# still go out in several pieces.
PIECE_BYTES = "COMMLIB_TEST_MPI_CALL_BYTES"


def values_of(entry):
    """(inside, outside): the boundary values the table allows, and those just beyond."""
    acc = entry.accepted
    m = re.fullmatch(r"integer (-?\d+) to (-?\d+)", acc) or re.fullmatch(r"integer >= (-?\d+)()", acc)
    if m:
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else 2 ** 63 - 1
        # (a testing-only pause at its maximum only waits longer: 1 s stands for it)
        top = min(hi, 1000) if entry.name in PAUSES_MS else hi
        inside = [lo] + ([0] if lo < 0 < hi else []) + [top]
        return [str(v) for v in inside], [str(lo - 1), str(hi + 1)]
    m = re.fullmatch(r"number (-?\d+) to (-?\d+)", acc)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        return [str(lo), str(hi)], [str(lo - 1), str(hi + 1)]
    if acc == "0 or 1":
        return ["0", "1"], ["2", "-1"]
    if acc == "a path":
        return [], []  # (COMMLIB_TIMELINE, COMMLIB_NCCL_LIBRARY, COMMLIB_AUTOTUNE_LOG: tests of their own)
    m = re.fullmatch(r"up to (\d+) hex digits", acc)
    if m:  # (COMMLIB_RUN_JOB: commlibrun's token, part of the segments' names)
        digits = int(m.group(1))
        return ["0", "f" * digits], ["0" * (digits + 1), "xyz"]
    choices = [c.strip() for c in acc.split(",")]
    return choices, ["bogus"]


def check_all(tag, larger=True):
    """Every collective kind, small and (``larger``) larger than the fusion
    sizes, against numpy."""
    r, n = commlib.rank(), commlib.size()
    for count in (3, FUSION // 8 + 5) if larger else (3,):
        x = np.arange(count, dtype=np.float64) + r
        want = sum(np.arange(count, dtype=np.float64) + q for q in range(n))
        check_equal(commlib.allreduce(x, name=f"{tag}.ar.{count}", op=commlib.Sum), want, f"{tag}: allreduce {count}")
        hs = [commlib.allreduce_async(x + i, name=f"{tag}.f{i}.{count}", op=commlib.Sum) for i in range(3)]
        for i, h in enumerate(hs):
            check_equal(commlib.synchronize(h), want + n * i, f"{tag}: fused allreduce {i} of {count}")
        check_equal(commlib.grouped_allreduce([x, x[:2]], name=f"{tag}.g.{count}", op=commlib.Sum)[1], want[:2],
                    f"{tag}: grouped allreduce {count}")
        rows = np.full((count // 3 + 1, 3), float(r))
        check_equal(commlib.allgather(rows, name=f"{tag}.ag.{count}"),
                    np.concatenate([np.full_like(rows, float(q)) for q in range(n)]), f"{tag}: allgather {count}")
        b = np.arange(count, dtype=np.int32) * (r + 1)
        check_equal(commlib.broadcast(b, root_rank=n - 1, name=f"{tag}.bc.{count}"),
                    np.arange(count, dtype=np.int32) * n, f"{tag}: broadcast {count}")
        a = np.full((n * (count // n + 1), 2), float(r))
        got = commlib.alltoall(a, name=f"{tag}.a2a.{count}")
        got = got[0] if isinstance(got, tuple) else got
        check_equal(got, np.concatenate([np.full((a.shape[0] // n, 2), float(q)) for q in range(n)]),
                    f"{tag}: alltoall {count}")
        rs = np.ones((n * 4, count // 8 + 1))
        check_equal(commlib.reducescatter(rs, op=commlib.Sum, name=f"{tag}.rs.{count}"),
                    np.full((4, count // 8 + 1), float(n)), f"{tag}: reducescatter {count}")
        if r == 0:
            commlib.send(x, dst=1, tag=count)
        elif r == 1:
            check_equal(commlib.recv(src=0, tag=count), np.arange(count, dtype=np.float64), f"{tag}: recv {count}")
    commlib.barrier()


def fail(msg):
    """(_common.fail needs init(), which may be what failed)"""
    print(f"rank {os.environ.get('PMI_RANK', '?')}: FAILED: {msg}", file=sys.stderr, flush=True)
    os._exit(1)


_common.fail = fail  # (check_equal's failures too)


class Watchdog:
    """Ends this rank, naming what it was doing, when a step hangs."""

    def __init__(self):
        self.what, self.deadline = "", float("inf")
        threading.Thread(target=self._watch, daemon=True).start()

    def arm(self, what):
        self.what, self.deadline = what, time.monotonic() + PER_VALUE_S

    def _watch(self):
        while True:
            time.sleep(0.2)
            if time.monotonic() > self.deadline:
                print(f"rank {os.environ.get('PMI_RANK', '?')}: FAILED: hung for {PER_VALUE_S} s at {self.what}",
                      file=sys.stderr, flush=True)
                faulthandler.dump_traceback(all_threads=True)
                os._exit(1)


def main():
    wanted = set(sys.argv[1:])
    dog = Watchdog()
    tried = 0
    start = time.monotonic()
    for entry in commlib.config.table():
        if wanted and entry.name not in wanted:
            continue
        inside, outside = values_of(entry)
        for value in inside:
            os.environ[entry.name] = value
            what = f"{entry.name}={value}"
            dog.arm(what)
            try:
                commlib.init()
            except Exception as e:  # noqa: BLE001 - report which value failed how
                fail(f"{what}: a value the table allows failed init(): {type(e).__name__}: {e}")
            try:
                check_all(f"{entry.name}.{value}", larger=entry.name != PIECE_BYTES or int(value) >= 4096)
            except Exception as e:  # noqa: BLE001
                fail(f"{what}: {type(e).__name__}: {e}")
            commlib.shutdown()
            tried += 1
        for value in outside:
            os.environ[entry.name] = value
            what = f"{entry.name}={value} (outside the table's range)"
            dog.arm(what)
            try:
                commlib.init()
            except ValueError as e:
                if entry.name not in str(e):
                    fail(f"{what}: the ValueError does not name the variable: {e}")
            else:
                commlib.shutdown()
                fail(f"{what}: init() accepted it")
            tried += 1
        os.environ.pop(entry.name, None)
    dog.arm("the final init")
    commlib.init()
    r = commlib.rank()
    print(f"rank {r}: {tried} values in {time.monotonic() - start:.1f} s", flush=True)
    print(f"rank {r}: OK", flush=True)
    commlib.shutdown()


main()

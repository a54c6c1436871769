"""Helpers shared by the coll_*.py worker scripts: deterministic per-rank
inputs, numpy reference results, and a cross-rank check that every rank got
bitwise the same results (through mpi4py, independent of commlib)."""
from __future__ import annotations

import hashlib
import os
import sys
import zlib

import ml_dtypes
import numpy as np
from mpi4py import MPI

import commlib
from _common import done

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64),
          np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64),
          np.dtype(np.bool_), np.dtype(np.int16), np.dtype(np.uint16), np.dtype(np.uint32),
          np.dtype(np.uint64)]
HALVES = (np.dtype(np.float16), BF16)
OPS = {"Sum": commlib.Sum, "Average": commlib.Average, "Min": commlib.Min, "Max": commlib.Max,
       "Product": commlib.Product}


def is_half(dt) -> bool:
    return np.dtype(dt) in HALVES


def is_int(dt) -> bool:
    return np.dtype(dt).kind in "iu"


def is_float(dt) -> bool:
    return np.dtype(dt).kind == "f" or is_half(dt)


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def make_input(rank: int, dtype, shape, op: str = "Sum", kind: str = "int", tag="") -> np.ndarray:
    """Rank ``rank``'s input of a check (any rank can compute any rank's).

    kind "int": integer values (exact in every float dtype, so float results
    are exact whatever the summation order); the 8-bit Sum/Product may wrap
    (as in numpy). kind "wrap": the full range of 8-bit ints. kind "rand":
    uniform floats in [-1, 1). Half types only: kind "tiny" (subnormals),
    kind "huge" (positive, near the largest finite value).
    """
    dt = np.dtype(dtype)
    return np.asarray(_values(np.random.default_rng(seed_of(rank, dt.name, tuple(shape), op, kind,
                                                            tag)), dt, tuple(shape), op, kind),
                      dtype=dt)


def _values(rng, dt, shape, op, kind):
    if dt == np.bool_:
        return rng.random(shape) < (0.8 if op in ("Min", "Product") else 0.2)
    if kind == "rand":
        return rng.uniform(-1.0, 1.0, shape).astype(dt)
    if kind == "tiny":  # subnormals of the half type (exact in float32)
        step = 2.0 ** (-24 if dt == np.float16 else -133)
        return (rng.integers(-300, 301, shape) * step).astype(dt)
    if kind == "huge":  # near the top of the range: sums overflow to inf
        top = 65504.0 if dt == np.float16 else float(ml_dtypes.finfo(BF16).max)
        return (rng.uniform(0.4, 1.0, shape) * top).astype(dt)
    if kind == "wrap":
        info = np.iinfo(dt)
        return rng.integers(info.min, int(info.max) + 1, shape, dtype=np.int64).astype(dt)
    if op == "Product":
        lo, hi = (0, 4) if dt.kind == "u" else (-3, 4)
    elif dt == np.uint8:
        lo, hi = 0, 50
    elif dt == np.int8:
        lo, hi = -25, 26
    elif dt == np.int16:
        lo, hi = -6000, 6001
    elif dt.kind == "u":  # uint16/32/64: sums of 3 ranks wrap around in uint16 (as in numpy)
        lo, hi = 0, 30000
    elif dt == np.int32:
        lo, hi = -(1 << 20), 1 << 20
    elif dt == np.int64:
        lo, hi = -(1 << 40), 1 << 40
    else:  # floats: small integers, exact everywhere (bfloat16 has 8 bits)
        lo, hi = -60, 61
    return rng.integers(lo, hi, shape, dtype=np.int64).astype(dt)


def _fold(arrays, op: str, dt):
    acc = arrays[0].copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for a in arrays[1:]:
            if op in ("Sum", "Average"):
                acc = np.add(acc, a, dtype=dt)
            elif op == "Min":
                acc = np.minimum(acc, a)
            elif op == "Max":
                acc = np.maximum(acc, a)
            elif op == "Product":
                acc = np.multiply(acc, a, dtype=dt)
    return np.asarray(acc, dtype=dt)


def reference_reduce(inputs, op: str, prescale: float = 1.0, postscale: float = 1.0):
    """numpy model of the reduction of the per-rank ``inputs`` (rank order)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _reference_reduce(inputs, op, prescale, postscale)


def _reference_reduce(inputs, op, prescale, postscale):
    n = len(inputs)
    dt = inputs[0].dtype
    shape = inputs[0].shape
    ins = [np.atleast_1d(x) for x in inputs]
    post = postscale * (1.0 / n if op == "Average" else 1.0)
    if dt == np.bool_:
        if op == "Average":
            raise AssertionError("no Average for bool")
        acc = ins[0].copy()
        for a in ins[1:]:
            acc = (acc | a) if op in ("Sum", "Max") else (acc & a)
        return acc.reshape(shape)
    if is_half(dt):  # widened to float32, scaled, reduced, scaled, rounded
        f32 = np.float32
        wide = [x.astype(f32) * f32(prescale) for x in ins]
        acc = _fold(wide, op, np.dtype(f32))
        return (acc * f32(post)).astype(dt).reshape(shape)
    if is_int(dt):
        if prescale != 1.0:
            ins = [np.trunc(x.astype(np.float64) * prescale).astype(dt) for x in ins]
        acc = _fold(ins, op, dt)
        if post != 1.0:
            acc = np.trunc(acc.astype(np.float64) * post).astype(dt)
        return acc.reshape(shape)
    t = dt.type
    if prescale != 1.0:
        ins = [x * t(prescale) for x in ins]
    acc = _fold(ins, op, dt)
    if post != 1.0:
        acc = acc * t(post)
    return np.asarray(acc, dtype=dt).reshape(shape)


def tolerance(dt, kind: str):
    """(rtol, atol) for comparing a result with the reference."""
    dt = np.dtype(dt)
    if kind != "rand":
        return 0.0, 0.0
    if dt == np.float16:
        return 2e-3, 2e-3
    if dt == BF16:
        return 1.6e-2, 1.6e-2
    if dt == np.float32:
        return 1e-5, 1e-6
    return 1e-12, 1e-14


def rows_of(dim0: int, n: int, r: int) -> int:
    return dim0 // n + (1 if r < dim0 % n else 0)


_failures: list[str] = []


def soft_fail(msg: str) -> None:
    """Reports a failed check and goes on (so that one bug does not hide the
    others); ``finish`` then exits non-zero."""
    print(f"rank {commlib.rank()}: FAILED: {msg}", file=sys.stderr, flush=True)
    _failures.append(msg)


def check_result(got, want, what, rtol=0.0, atol=0.0) -> bool:
    """Same shape, dtype and values; exact comparisons of floats are bit for
    bit (a 1-ulp error or a lost sign of zero is caught)."""
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        soft_fail(f"{what}: shape {got.shape} != expected {want.shape}")
        return False
    if got.dtype != want.dtype:
        soft_fail(f"{what}: dtype {got.dtype} != expected {want.dtype}")
        return False
    g, w = np.atleast_1d(got).ravel(), np.atleast_1d(want).ravel()
    if rtol == 0 and atol == 0 and is_float(want.dtype):
        u = np.dtype(f"u{want.dtype.itemsize}")
        bad = np.flatnonzero(g.view(u) != w.view(u))
    elif rtol == 0 and atol == 0:
        bad = np.flatnonzero(g != w)
    else:
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        bad = np.flatnonzero(~np.isclose(g64, w64, rtol=rtol, atol=atol))
    if bad.size:
        soft_fail(f"{what}: {bad.size} of {w.size} elements differ, first at {bad[:4]}: "
                  f"got {g[bad[:4]]} expected {w[bad[:4]]}")
        return False
    return True


def check_true(cond, what: str) -> None:
    if not cond:
        soft_fail(what)


def soft_raises(exc_type, fn, what: str):
    try:
        fn()
    except exc_type as e:
        return e
    except Exception as e:  # noqa: BLE001 - report the wrong type
        soft_fail(f"{what}: expected {exc_type.__name__}, got {type(e).__name__}: {e}")
        return None
    soft_fail(f"{what}: expected {exc_type.__name__}, nothing was raised")
    return None


def submit_agreed(submit, what: str):
    """Calls ``submit()`` (which starts a collective and returns its handle)
    on every rank and returns (handle, None), or (None, exception) when every
    rank refused the call. When only some ranks refused, the others would wait
    for them forever: that is reported and the job ends at once."""
    try:
        handle, err = submit(), None
    except Exception as e:  # noqa: BLE001 - reported below
        handle, err = None, e
    outcomes = MPI.COMM_WORLD.allgather(None if err is None else f"{type(err).__name__}: {err}")
    if all(o is None for o in outcomes) or all(o is not None for o in outcomes):
        return handle, err
    detail = "; ".join(f"rank {q}: {o or 'accepted'}" for q, o in enumerate(outcomes))
    soft_fail(f"{what}: only some ranks refused the call, the others would hang: {detail}")
    abort()


def expect_refused(submit, exc_type, what: str) -> None:
    """Every rank must refuse ``submit()`` with exc_type (checked before
    anything is sent, so no rank waits for the others)."""
    handle, err = submit_agreed(submit, what)
    if err is None:
        commlib.synchronize(handle)
        soft_fail(f"{what}: expected {exc_type.__name__}, nothing was raised")
    elif not isinstance(err, exc_type):
        soft_fail(f"{what}: expected {exc_type.__name__}, got {type(err).__name__}: {err}")


def abort() -> None:
    """Ends this rank now (without MPI_Finalize: peers may have collectives
    pending that can never complete)."""
    print(f"rank {commlib.rank()}: {len(_failures)} checks FAILED; aborting the job",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


class Ledger:
    """Records every result; ``check_identical`` proves that all ranks hold
    bitwise the same bytes for every recorded result."""

    def __init__(self):
        self.names: list[str] = []
        self.digests: list[str] = []

    def record(self, name: str, arr) -> None:
        arr = np.asarray(arr)
        h = hashlib.sha1(np.ascontiguousarray(arr).tobytes())
        h.update(f"{arr.dtype.str}{arr.shape}".encode())
        self.names.append(name)
        self.digests.append(h.hexdigest())

    def check_identical(self) -> int:
        everyone = MPI.COMM_WORLD.allgather((self.names, self.digests))
        names0, digests0 = everyone[0]
        for r, (names, digests) in enumerate(everyone):
            if names != names0:
                soft_fail(f"rank {r} recorded a different sequence of results than rank 0")
                continue
            for name, d, d0 in zip(names, digests, digests0):
                if d != d0:
                    soft_fail(f"{name}: result bytes on rank {r} differ from rank 0")
        return len(names0)


def finish(ledger: Ledger | None = None) -> None:
    """Cross-rank identity check, then the OK line or a non-zero exit."""
    if ledger is not None:
        count = ledger.check_identical()
        print(f"rank {commlib.rank()}: {count} results bitwise identical on all ranks", flush=True)
    if _failures:
        print(f"rank {commlib.rank()}: {len(_failures)} checks FAILED", file=sys.stderr, flush=True)
        sys.exit(1)
    done()

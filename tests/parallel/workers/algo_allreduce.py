"""Worker for tests/parallel/test_allreduce_algos.py: allreduce against numpy
under the algorithm selected by COMMLIB_ALLREDUCE_ALGO (ring, tree, mpi).

Every dtype x op x size case is run in one launch. Each rank builds every
rank's input from a seed, computes the expected result with numpy and checks
its own; at the end the ranks compare (through mpi4py) digests of all their
result bytes, which must be identical on every rank. Failed checks are printed
as ``rank R: FAILED: ...`` on stderr and the worker exits non-zero after the
other checks; a rank that got through prints ``rank R: OK``.

Arguments: ``quick`` runs fewer sizes (for the 5-rank run).
"""
import hashlib
import os
import sys

import numpy as np
from mpi4py import MPI

import commlib

try:  # bfloat16 is optional
    import ml_dtypes
    BF16 = [np.dtype(ml_dtypes.bfloat16)]
except ImportError:
    BF16 = []

commlib.init()
r, n = commlib.rank(), commlib.size()
ALGO = os.environ.get("COMMLIB_ALLREDUCE_ALGO", "auto")
QUICK = "quick" in sys.argv[1:]

DTYPES = [np.dtype(d) for d in ("uint8", "int8", "int32", "int64", "float16", "float32",
                                "float64", "bool", "int16", "uint16", "uint32",
                                "uint64")] + BF16
OPS = {"Sum": commlib.Sum, "Min": commlib.Min, "Max": commlib.Max,
       "Product": commlib.Product, "Average": commlib.Average}
# Empty, one element, fewer elements than ranks, not divisible by the ranks,
# several ring chunks per segment (256 KiB chunks).
SIZES = [0, 1, n - 1, n + 1, 1000, 1_000_003]
if QUICK:
    SIZES = [0, 1, n - 1, n + 1, 1000, 100_003]

failures = []
digests = []  # (case name, sha256 of the result bytes), in the same order on every rank


def fail(msg):
    failures.append(msg)
    print(f"rank {r} [{ALGO}, {n} ranks]: FAILED: {msg}", file=sys.stderr, flush=True)


def is_float(dt):
    return dt.kind == "f" or dt.name == "bfloat16"


def make_input(q, dt, op, size, case_seed):
    """Rank q's input: values small enough that integer sums and products of
    up to 5 ranks do not overflow, floats near 1 for products."""
    rng = np.random.default_rng([case_seed, q])
    if dt == np.bool_:
        return rng.random(size) < 0.5
    if is_float(dt):
        if op == "Product":
            return rng.uniform(0.5, 1.5, size).astype(dt)
        return rng.standard_normal(size, dtype=np.float32).astype(dt)
    if op == "Product":
        lo, hi = (0, 3) if dt.kind == "u" else (-2, 2)
    else:
        lo, hi = (0, 40) if dt.kind == "u" else (-20, 20)
    return rng.integers(lo, hi, size, endpoint=True).astype(dt)


def reference(inputs, dt, op):
    """What the core computes: half types widened to float32, integer Average
    as trunc(sum * (1/n)) in double, bool Sum/Max = or, Min/Product = and."""
    stack = np.stack(inputs)
    if dt == np.bool_:
        return (stack.any(axis=0) if op in ("Sum", "Max") else stack.all(axis=0))
    work = stack.astype(np.float32) if dt.itemsize == 2 and is_float(dt) else stack
    if op == "Min":
        out = work.min(axis=0)
    elif op == "Max":
        out = work.max(axis=0)
    elif op == "Product":
        out = work.prod(axis=0, dtype=work.dtype)
    elif op == "Sum":
        out = work.sum(axis=0, dtype=work.dtype)
    else:  # Average
        if is_float(dt):
            out = work.sum(axis=0, dtype=work.dtype) * work.dtype.type(1.0 / n)
        else:
            s = stack.sum(axis=0, dtype=np.int64).astype(np.float64)
            out = np.trunc(s * (1.0 / n))
    return out.astype(dt)


def tolerance(dt, op):
    """(rtol, atol): exact for integers, bool, Min and Max; otherwise the
    summation order of the algorithm differs from numpy's."""
    if not is_float(dt) or op in ("Min", "Max"):
        return 0.0, 0.0
    return {"float64": (1e-12, 1e-12), "float32": (1e-5, 1e-5), "float16": (2e-3, 4e-3),
            "bfloat16": (1.6e-2, 3e-2)}[dt.name]


def check(name, got, want, rtol=0.0, atol=0.0):
    if got.dtype != want.dtype or got.shape != want.shape:
        fail(f"{name}: got {got.dtype}{got.shape}, expected {want.dtype}{want.shape}")
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    ok = np.array_equal(g, w) if rtol == 0 and atol == 0 else np.allclose(g, w, rtol, atol)
    if not ok:
        bad = np.flatnonzero(~np.isclose(g, w, rtol, atol))[:5]
        fail(f"{name}: mismatch at {bad.tolist()}: got {g[bad].tolist()} expected {w[bad].tolist()}")


def record(name, got):
    digests.append((name, hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest()))


def run_case(name, inputs, op, want, rtol, atol, inplace):
    mine = inputs[r].copy()
    if inplace:
        got = commlib.allreduce_(mine, op=OPS[op], name=name)
    else:
        got = commlib.allreduce(mine, op=OPS[op], name=name)
        check(name + " (input untouched)", mine, inputs[r])
    check(name, got, want, rtol, atol)
    record(name, got)


seed = 0
for dt in DTYPES:
    for op in OPS:
        if dt == np.bool_ and op == "Average":
            continue  # rejected before reaching the algorithms
        for size in SIZES:
            seed += 1
            inputs = [make_input(q, dt, op, size, seed) for q in range(n)]
            name = f"{dt.name} {op} size={size}"
            # Alternate in place / out of place; both end in the same core path.
            run_case(name, inputs, op, reference(inputs, dt, op), *tolerance(dt, op),
                     inplace=seed % 2 == 0)

# Results that could depend on the evaluation order bit for bit: float32 sums
# over values spread across 12 orders of magnitude, and Min/Max over mixed
# signed zeros (the core's Min takes -0 and Max +0, in either order). Checked
# against numpy by value; the digest comparison below checks the bits.
size = 1000 if QUICK else 1_000_003
wide = []
for q in range(n):
    rng = np.random.default_rng([4242, q])
    wide.append((rng.standard_normal(size) * 10.0 ** rng.uniform(-6, 6, size)).astype(np.float32))
want = np.sum(np.stack(wide).astype(np.float64), axis=0)
mine = wide[r].copy()
got = commlib.allreduce_(mine, op=commlib.Sum, name="float32 wide-range Sum")
scale = np.max(np.abs(np.stack(wide)), axis=0).astype(np.float64)
if not np.all(np.abs(got - want) <= 1e-6 * scale * n + 1e-30):
    fail("float32 wide-range Sum: result too far from the float64 sum")
record("float32 wide-range Sum", got)
for op in ("Min", "Max"):
    zeros = [np.random.default_rng([777, q]).choice(np.float32([0.0, -0.0]), 4099) for q in range(n)]
    got = commlib.allreduce(zeros[r], op=OPS[op], name=f"signed zeros {op}")
    check(f"signed zeros {op}", got, np.zeros(4099, np.float32))
    # (-0 where any rank holds -0 for Min, +0 where any holds +0 for Max)
    negative = np.stack([np.signbit(z) for z in zeros])
    want_sign = negative.any(axis=0) if op == "Min" else negative.all(axis=0)
    if not np.array_equal(np.signbit(got), want_sign):
        fail(f"signed zeros {op}: the sign bits are not those of the ranks' {op}")
    record(f"signed zeros {op}", got)

# Min/Max with NaN: a NaN on any rank is the result (as numpy's minimum and
# maximum), whichever rank held it and however the algorithm orders ranks;
# elements 0..n-1 hold a NaN on rank i only, the others none (and infinities).
for dt in [d for d in DTYPES if is_float(d)]:
    for op, fold in (("Min", np.minimum), ("Max", np.maximum)):
        parts = []
        for q in range(n):
            v = np.random.default_rng([31, q]).standard_normal(2 * n + 5).astype(np.float32)
            v[q] = np.nan
            v[n + q] = np.inf if q % 2 else -np.inf
            parts.append(v.astype(dt))
        want = fold.reduce(np.stack(parts), axis=0)
        got = commlib.allreduce(parts[r], op=OPS[op], name=f"{dt.name} NaN {op}")
        if not np.array_equal(got.astype(np.float64), want.astype(np.float64), equal_nan=True):
            fail(f"{dt.name} NaN {op}: got {got.tolist()} expected {want.tolist()}")
        record(f"{dt.name} NaN {op}", got)

# float16 travels as it is through the ring and the tree (half the bytes of
# float32 between hosts), each step rounding its partial sum to float16; the
# shared segment and MPI's collective reduce it widened to float32, rounding
# once. 1.0 on rank 0 and 2^-11 (half of float16's spacing at 1.0) on the
# others: added to 1.0 one at a time, each 2^-11 rounds away (ties to even),
# added to each other first they count.
if n >= 3:
    tiny = np.float16(2.0 ** -11)
    parts = [np.ones(3000, np.float16)] + [np.full(3000, tiny, np.float16) for _ in range(n - 1)]
    got = commlib.allreduce(parts[r], op=commlib.Sum, name="float16 rounding per step")
    once = np.float16(1.0 + (n - 1) * 2.0 ** -11)  # (widened to float32, rounded at the end)
    if not np.all((got >= 1.0) & (got <= 1.0 + n * 2.0 ** -11)):
        fail(f"float16 rounding per step: results outside [1, 1 + n 2^-11]: {np.unique(got)}")
    elif ALGO in ("ring", "tree") and np.all(got == once):
        fail(f"float16 under {ALGO}: every element is {once}, the float32-widened sum: "
             "float16 did not travel as float16")
    elif ALGO not in ("ring", "tree") and not np.all(got == once):
        fail(f"float16 under {ALGO}: {np.unique(got)}, expected {once} (widened to float32)")
    record("float16 rounding per step", got)

# Bitwise identical results on every rank.
everyone = MPI.COMM_WORLD.allgather(digests)
for i, (name, digest) in enumerate(digests):
    others = [q for q in range(n) if everyone[q][i] != (name, digest)]
    if others:
        fail(f"{name}: result bytes differ from those of ranks {others}")

if failures:
    sys.exit(1)
print(f"rank {r}: OK ({len(digests)} cases, algo {ALGO})", flush=True)

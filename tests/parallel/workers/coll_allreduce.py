"""allreduce against numpy: every dtype x op x shape x scale factors, in-place
and out-of-place, plus big messages. Each rank computes the expected result
from every rank's (deterministic) input and checks its own; at the end all
ranks prove their results are bitwise identical.

With the argument ``quick``: fewer shapes and scale factors (for 4 ranks and
for the runs with other core settings, which only need to cover the paths).
"""
import sys

import numpy as np

import commlib
from coll_common import (DTYPES, OPS, Ledger, check_result, check_true, finish, is_float, is_half,
                         make_input, reference_reduce, soft_raises, tolerance)

commlib.init()
r, n = commlib.rank(), commlib.size()
ledger = Ledger()

QUICK = sys.argv[1:] == ["quick"]
SHAPES = [(0,), (1,), (max(n - 1, 1),), (7,), (2 * n + 1,), (3, 5, 2), (0, 3), (4, 1, 3)]
if QUICK:
    SHAPES = [(0,), (1,), (2 * n + 1,), (3, 5, 2)]


def scales_for(dt):
    if dt == np.bool_:
        return [(1.0, 1.0)]
    neg = 1.5 if dt == np.uint8 else -1.5  # no negative values for uint8
    if QUICK:
        return [(1.0, 1.0), (neg, 0.25)]
    return [(1.0, 1.0), (2.0, 1.0), (1.0, 0.5), (neg, 0.25)]


def run_case(dt, opname, shape, pre, post, kind, inplace):
    what = (f"allreduce{'_' if inplace else ''} {dt.name} {opname} shape={shape} "
            f"pre={pre} post={post} kind={kind}")
    inputs = [make_input(q, dt, shape, opname, kind) for q in range(n)]
    want = reference_reduce(inputs, opname, pre, post)
    mine = inputs[r].copy()
    kw = dict(op=OPS[opname], prescale_factor=pre, postscale_factor=post)
    if inplace:
        got = commlib.allreduce_(mine, **kw)
        check_true(got is mine, f"{what}: allreduce_ did not return the array it was given")
        check_result(mine, want, what + " (array written in place)", *tolerance(dt, kind))
    else:
        got = commlib.allreduce(mine, **kw)
        check_result(mine, inputs[r], what + ": input was modified")
        check_true(not np.shares_memory(got, mine), f"{what}: result shares memory with input")
    check_result(got, want, what, *tolerance(dt, kind))
    ledger.record(what, got)


for dt in DTYPES:
    for opname in OPS:
        if dt == np.bool_ and opname == "Average":
            x = make_input(r, dt, (5,))
            soft_raises(TypeError, lambda: commlib.allreduce(x, op=commlib.Average), "bool Average")
            soft_raises(TypeError, lambda: commlib.allreduce_(x.copy(), op=commlib.Average),
                        "bool Average in place")
            continue
        for shape in SHAPES:
            for pre, post in scales_for(dt):
                for inplace in (False, True):
                    run_case(dt, opname, shape, pre, post, "int", inplace)
        if dt.kind in "iu" and dt.itemsize == 1 and opname in ("Sum", "Product"):
            for shape in [(7,), (64, 3)]:  # full range: wraps like numpy
                run_case(dt, opname, shape, 1.0, 1.0, "wrap", False)
                run_case(dt, opname, shape, 1.0, 1.0, "wrap", True)
        if is_half(dt):  # subnormals and overflow to inf, exact
            for kind in ("tiny", "huge"):
                for pre, post in [(1.0, 1.0), (0.5, 2.0)]:
                    run_case(dt, opname, (5, 7), pre, post, kind, False)
                    run_case(dt, opname, (9,), pre, post, kind, True)
        if is_float(dt):  # non-integer values: compared with a tolerance
            for shape in [(7,), (5, 9), (1000,)]:
                run_case(dt, opname, shape, 1.0, 1.0, "rand", False)
                run_case(dt, opname, shape, 0.5, 2.0, "rand", True)

# int64 beyond 2**53: the path must never go through double.
big = np.array([(1 << 60) + 1, -(1 << 61) - 3, (1 << 59) + 7], dtype=np.int64) + r
for opname in ("Sum", "Min", "Max"):
    want = reference_reduce([big - r + q for q in range(n)], opname)
    got = commlib.allreduce(big, op=OPS[opname])
    check_result(got, want, f"int64 beyond 2**53 {opname}")
    ledger.record(f"int64 big {opname}", got)

# Default op is Average.
x = np.arange(6, dtype=np.float64) * (r + 1)
check_result(commlib.allreduce(x), np.arange(6, dtype=np.float64) * ((n + 1) / 2.0) * 1.0,
             "default op (Average)", rtol=1e-15)

# Big messages (several MB; many shared-memory blocks / MPI chunks).
N = 3_000_001
base = (np.arange(N, dtype=np.int64) % 1021).astype(np.float32)
x = base + np.float32(r)
want = base * np.float32(n) + np.float32(n * (n - 1) // 2)
got = commlib.allreduce_(x, op=commlib.Sum)
check_result(x, want, "3M float32 Sum in place")
ledger.record("big f32 sum", x)
y = base - np.float32(r)
got = commlib.allreduce(y, op=commlib.Average)
check_result(got, (base * np.float32(n) - np.float32(n * (n - 1) // 2)) * np.float32(1.0 / n),
             "3M float32 Average")
check_result(y, base - np.float32(r), "3M float32 Average: input unchanged")
ledger.record("big f32 avg", got)
# Out of place into a given buffer: the shared-memory algorithm reads the
# input where it would have read the output (no copy first); with a prescale
# factor the input is copied and scaled first.
for pre in (1.0, 2.0):
    out = np.full(N, -1.0, np.float32)
    got = commlib.allreduce(y, op=commlib.Sum, prescale_factor=pre, out=out)
    check_true(got is out, f"3M float32 out= (pre {pre}): the result is not out")
    check_result(out, (base * np.float32(n) - np.float32(n * (n - 1) // 2)) * np.float32(pre),
                 f"3M float32 Sum into out= (pre {pre})")
    check_result(y, base - np.float32(r), f"3M float32 Sum into out= (pre {pre}): input unchanged")
    ledger.record(f"big f32 out {pre}", out)
z = np.zeros(100, np.float32)
err = soft_raises(ValueError, lambda: commlib.allreduce(z[:50], out=z[10:60]), "out= overlapping")
check_true(err is None or "overlaps" in str(err), f"overlap error message: {err}")
del x, y, base, got

M = 1_000_003
h = ((np.arange(M) % 61) - 30 + r).astype(np.float16)
want = reference_reduce([((np.arange(M) % 61) - 30 + q).astype(np.float16) for q in range(n)],
                        "Sum", 2.0, 0.5)
got = commlib.allreduce(h, op=commlib.Sum, prescale_factor=2.0, postscale_factor=0.5)
check_result(got, want, "1M float16 Sum with scaling")
ledger.record("big f16", got)
i64 = (np.arange(M, dtype=np.int64) * 7919 + r * 104729) % 1000003
want = reference_reduce([(np.arange(M, dtype=np.int64) * 7919 + q * 104729) % 1000003
                         for q in range(n)], "Max")
got = commlib.allreduce(i64, op=commlib.Max)
check_result(got, want, "1M int64 Max")
ledger.record("big i64", got)

finish(ledger)

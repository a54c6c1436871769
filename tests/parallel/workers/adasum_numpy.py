"""op=Adasum on numpy arrays against adasum_reference (float64 within 1e-6;
float32, float16 and bfloat16 within their precision): single tensors of
several shapes, zero tensors (the 1e-8 guard), tensors of very different
sizes and scales fused into one buffer (grouped_allreduce, and async requests
negotiated together), scale factors, in place, a process set of the ranks
1..n-1; every rank's results bitwise identical. Then the errors: integer
dtypes (TypeError before anything is sent), reducescatter (ValueError), an
op or dtype that differs across ranks (CollectiveMismatchError on every
rank), and a collective after them still works."""
import numpy as np

import commlib
from adasum_reference import adasum
from coll_common import BF16, Ledger, check_result, check_true, finish, seed_of, soft_raises

commlib.init()
r, n = commlib.rank(), commlib.size()
ledger = Ledger()
Adasum = commlib.Adasum
TOL = {np.dtype(np.float64): 1e-6, np.dtype(np.float32): 1e-5, np.dtype(np.float16): 1e-2,
       BF16: 5e-2}


def inputs(tag, shape, dtype=np.float64, scale=1.0, zero_on=()):
    """Every rank's input of a check (each rank can compute every rank's)."""
    out = []
    for q in range(n):
        rng = np.random.default_rng(seed_of(tag, q))
        x = rng.standard_normal(shape) * scale + (0.5 if q % 2 else -0.25)
        out.append(np.zeros(shape, dtype) if q in zero_on else x.astype(dtype))
    return out


def check_close(got, want, what, dtype, record=True):
    """Elementwise within TOL relative to the largest magnitude of the result
    (recorded for the check that every rank holds the same bytes)."""
    want64 = np.asarray(want, dtype=np.float64)
    atol = TOL[np.dtype(dtype)] * max(float(np.max(np.abs(want64), initial=0.0)), 1e-300)
    check_result(np.asarray(got).astype(np.float64), want64, what, rtol=0, atol=atol)
    check_true(np.asarray(got).dtype == np.dtype(dtype), f"{what}: dtype {np.asarray(got).dtype}")
    if record:
        ledger.record(what, got)


# ---- single tensors: shapes, dtypes, zeros, scale factors, in place
for dtype in (np.float64, np.float32, np.float16, BF16):
    for shape in [(7,), (3, 5), (1,), (0,), (1000,)]:
        xs = inputs(("single", shape, str(dtype)), shape, dtype)
        want = adasum([x.astype(np.float64) for x in xs])
        what = f"allreduce Adasum {np.dtype(dtype).name} {shape}"
        check_close(commlib.allreduce(xs[r], op=Adasum, name=what), want, what, dtype)

xs = inputs("pre-post", (33,))
want = adasum([2.0 * x for x in xs]) * 0.25
check_close(commlib.allreduce(xs[r], op=Adasum, prescale_factor=2.0, postscale_factor=0.25),
            want, "Adasum with scale factors", np.float64)
mine = xs[r].copy()
got = commlib.allreduce_(mine, op=Adasum)
check_true(got is mine, "allreduce_ Adasum returned another array")
check_close(mine, adasum(xs), "allreduce_ Adasum in place", np.float64)

# zeros: on rank 0 only (its coefficient guard), and on every rank
xs = inputs("zero0", (9,), zero_on=(0,))
check_close(commlib.allreduce(xs[r], op=Adasum), adasum(xs), "Adasum, zeros on rank 0", np.float64)
xs = inputs("zeroall", (9,), zero_on=tuple(range(n)))
check_close(commlib.allreduce(xs[r], op=Adasum), np.zeros(9), "Adasum, zeros everywhere",
            np.float64)

# ---- fused: tensors of different sizes and scales, each with its own coefficients
SPECS = [((5,), 1.0, ()), ((300,), 100.0, ()), ((1,), 0.01, ()), ((4, 6), 1.0, (1,)),
         ((17,), 1e-3, ())]
groups = [inputs(("fused", i), shape, scale=s, zero_on=z) for i, (shape, s, z) in enumerate(SPECS)]
wants = [adasum(g) for g in groups]
# (the check can fail: one set of coefficients for the whole buffer gives another result)
flat = adasum([np.concatenate([g[q].ravel() for g in groups]) for q in range(n)])
check_true(not np.allclose(flat[:5], wants[0].ravel(), rtol=1e-3),
           "the fused check cannot tell per-tensor from whole-buffer coefficients")
for dtype in (np.float64, np.float32):
    got = commlib.grouped_allreduce([g[r].astype(dtype) for g in groups], op=Adasum,
                                    name=f"grouped.{np.dtype(dtype).name}")
    for i, (g, w) in enumerate(zip(got, wants)):
        check_close(g, adasum([x.astype(dtype) for x in groups[i]]),
                    f"grouped_allreduce Adasum {np.dtype(dtype).name} tensor {i}", dtype)
handles = [commlib.allreduce_async(g[r], op=Adasum, name=f"async.{i}") for i, g in enumerate(groups)]
for i, (h, w) in enumerate(zip(handles, wants)):
    check_close(commlib.synchronize(h), w, f"allreduce_async Adasum tensor {i}", np.float64)

# ---- a process set of ranks 1..n-1 (at 4 ranks: 3, not a power of two)
ps = commlib.add_process_set(list(range(1, n)))
if r >= 1:
    xs = inputs("set", (11,))[1:]
    got = commlib.allreduce(xs[r - 1], op=Adasum, process_set=ps)
    check_close(got, adasum(xs), "Adasum on the process set 1..n-1", np.float64, record=False)
    every = commlib.allgather(got[None], process_set=ps)
    check_true(all(np.array_equal(row, got) for row in every),
               "Adasum on the process set: results differ across its ranks")
commlib.barrier()

# ---- errors
for what, fn in [
        ("allreduce", lambda: commlib.allreduce(np.ones(3, np.int32), op=Adasum)),
        ("allreduce_", lambda: commlib.allreduce_(np.ones(3, np.int64), op=Adasum)),
        ("allreduce_async_", lambda: commlib.allreduce_async_(np.ones(3, np.int32), name="i",
                                                              op=Adasum)),
        ("grouped_allreduce", lambda: commlib.grouped_allreduce(
            [np.ones(2), np.ones(2, np.uint8)], op=Adasum))]:
    err = soft_raises(TypeError, fn, f"{what} Adasum of integers")
    check_true(err is None or "Adasum" in str(err), f"{what}: message lacks Adasum: {err}")
soft_raises(ValueError, lambda: commlib.reducescatter(np.ones((n, 2)), op=Adasum),
            "reducescatter with Adasum")
odd = r == n - 1
err = soft_raises(commlib.CollectiveMismatchError,
                  lambda: commlib.allreduce(np.ones(4), op=commlib.Sum if odd else Adasum,
                                            name="t.op"), "op Adasum on some ranks, Sum on one")
check_true(err is None or ("reduction op" in str(err) and "Adasum" in str(err)),
           f"op mismatch message: {err}")
soft_raises(commlib.CollectiveMismatchError,
            lambda: commlib.allreduce(np.ones(4, np.float32 if odd else np.float64), op=Adasum,
                                      name="t.dtype"), "Adasum with dtypes that differ")
xs = inputs("after", (6,))
check_close(commlib.allreduce(xs[r], op=Adasum), adasum(xs), "Adasum after the errors", np.float64)
finish(ledger)

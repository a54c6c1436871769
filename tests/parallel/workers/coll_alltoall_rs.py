"""alltoall (equal and explicit splits, including zeros; received splits) and
reducescatter (every op, dimension 0 not divisible by the ranks, scaling,
explicit splits) for
every dtype (results differ per rank by design, so no cross-rank identity
check here). With the argument ``small``: only reducescatter with dimension 0
smaller than the number of ranks (some ranks get no rows)."""
import sys

import numpy as np

import commlib
from coll_common import (DTYPES, OPS, check_result, check_true, expect_refused, finish,
                         make_input, reference_reduce, rows_of, soft_fail, submit_agreed)

commlib.init()
r, n = commlib.rank(), commlib.size()

# ------------------------------------------------------------------ reducescatter
SCALES = [(1.0, 1.0), (2.0, 0.5)]


def rs_case(dt, opname, dim0, trail, pre, post, default_op=False):
    what = f"reducescatter {dt.name} {opname} dim0={dim0} trailing={trail} pre={pre} post={post}"
    ins = [make_input(q, dt, (dim0,) + trail, opname, "int", tag="rs") for q in range(n)]
    full = reference_reduce(ins, opname, pre, post)
    start = sum(rows_of(dim0, n, q) for q in range(r))
    want = full[start:start + rows_of(dim0, n, r)]
    mine = ins[r].copy()
    kw = {} if default_op else {"op": OPS[opname]}
    submit = lambda: commlib.reducescatter_async(  # noqa: E731
        mine, prescale_factor=pre, postscale_factor=post, **kw)
    if rows_of(dim0, n, n - 1) == 0 < dim0:
        # some ranks get no rows: make sure a refusal on some ranks only
        # ends the job instead of leaving the others waiting
        h, err = submit_agreed(submit, what)
        if err is not None:
            soft_fail(f"{what}: refused on every rank: {type(err).__name__}: {err}")
            return
    else:
        h = submit()
    got = commlib.synchronize(h)
    check_result(got, want, what)
    check_result(mine, ins[r], what + ": input modified")


if sys.argv[1:] == ["small"]:
    # dimension 0 smaller than the number of ranks: the first dim0 ranks get
    # one row each, the others none
    for dt in DTYPES:
        for opname in OPS:
            if dt == np.bool_ and opname == "Average":
                continue
            for dim0 in sorted({1, n - 1}):
                for trail in [(), (3,)]:
                    rs_case(dt, opname, dim0, trail, 1.0, 1.0)
    finish()
    sys.exit(0)

# ------------------------------------------------------------------ alltoall
TRAILING = [(), (2,), (2, 3)]
for dt in DTYPES:
    for k in (0, 1, 3):
        for trail in TRAILING:
            what = f"alltoall equal {dt.name} k={k} trailing={trail}"
            ins = [make_input(q, dt, (n * k,) + trail, tag="a2a") for q in range(n)]
            mine = ins[r].copy()
            got = commlib.alltoall(mine)
            check_true(isinstance(got, np.ndarray), f"{what}: without splits the result is not an array")
            check_result(got, np.concatenate([x[r * k:(r + 1) * k] for x in ins]), what)
            check_result(mine, ins[r], what + ": input modified")

SPLITS = {
    "(q+2i)%3": lambda q, i: (q + 2 * i) % 3,
    "zeros": lambda q, i: 0,
    "to-next": lambda q, i: 2 if i == (q + 1) % n else 0,
    "to-self": lambda q, i: 3 if i == q else 0,
    "from-0": lambda q, i: i + 1 if q == 0 else 0,
    "equal": lambda q, i: 2,
}
for dt in DTYPES:
    for sname, S in SPLITS.items():
        for trail in [(), (3,)]:
            for form in ("list", "tuple", "ndarray"):
                if form != "list" and (trail != () or dt != np.float32):
                    continue
                what = f"alltoall splits={sname} {dt.name} trailing={trail} ({form})"
                splits = [[S(q, i) for i in range(n)] for q in range(n)]
                ins = [make_input(q, dt, (sum(splits[q]),) + trail, tag=("a2as", sname)) for q in range(n)]
                want = []
                for q in range(n):
                    off = sum(splits[q][:r])
                    want.append(ins[q][off:off + splits[q][r]])
                mine_splits = {"list": list, "tuple": tuple, "ndarray": np.array}[form](splits[r])
                got, recv = commlib.alltoall(ins[r], splits=mine_splits)
                check_result(got, np.concatenate(want), what)
                check_result(np.asarray(recv), np.array([splits[q][r] for q in range(n)], np.int64),
                             what + ": received splits")

# many in flight
hs = []
for k in range(40):
    dt = DTYPES[k % len(DTYPES)]
    splits = [[(q * 7 + i * 3 + k) % 4 for i in range(n)] for q in range(n)]
    ins = [make_input(q, dt, (sum(splits[q]), 2), tag=("a2aasync", k)) for q in range(n)]
    hs.append((commlib.alltoall_async(ins[r], splits=splits[r]), ins, splits, k))
for h, ins, splits, k in reversed(hs):
    got, recv = commlib.synchronize(h)
    want = [ins[q][sum(splits[q][:r]):sum(splits[q][:r + 1])] for q in range(n)]
    check_result(got, np.concatenate(want), f"alltoall_async #{k}")
    check_result(recv, np.array([splits[q][r] for q in range(n)], np.int64), f"alltoall_async #{k} splits")

# big
rows = [[100_000 * (1 + (q + i) % 3) for i in range(n)] for q in range(n)]
ins_r = np.arange(sum(rows[r]) * 4, dtype=np.float32).reshape(-1, 4) + r * 1e6
got, recv = commlib.alltoall(ins_r, splits=rows[r])
want = []
for q in range(n):
    x = np.arange(sum(rows[q]) * 4, dtype=np.float32).reshape(-1, 4) + q * 1e6
    off = sum(rows[q][:r])
    want.append(x[off:off + rows[q][r]])
check_result(got, np.concatenate(want), "big alltoall")
# big with equal splits (auto: MPI's own alltoall, 1.6 MB sent by a rank)
x = np.arange(n * 100_000 * 4, dtype=np.float32).reshape(-1, 4) + r * 1e7
got = commlib.alltoall(x)
want = [(np.arange(n * 100_000 * 4, dtype=np.float32).reshape(-1, 4) + q * 1e7)[r * 100_000:(r + 1) * 100_000]
        for q in range(n)]
check_result(got, np.concatenate(want), "big alltoall, equal splits")

# bad splits are refused on every rank (nothing sent)
x = np.zeros((n, 2))
expect_refused(lambda: commlib.alltoall_async(x, splits=[1] * (n + 1)), ValueError, "splits too long")
expect_refused(lambda: commlib.alltoall_async(x, splits=[-1] + [1] * (n - 2) + [3]), ValueError,
               "negative split")
expect_refused(lambda: commlib.alltoall_async(x, splits=[n] * n), ValueError, "splits not summing to dim0")
# splits whose int64 sum wraps around to dimension 0 (at 3 ranks 2 * (2**63 - 1) + 2 = 2**64; at 2 a
# negative sum): once a std::bad_alloc that killed a rank
empty = np.zeros((0, 2))
expect_refused(lambda: commlib.alltoall_async(empty, splits=[2 ** 63 - 1] * 2 + [2] + [0] * (n - 3)
                                              if n >= 3 else [2 ** 63 - 1] * 2), ValueError,
               "splits whose sum wraps around")

# ------------------------------------------------------------------ reducescatter
for dt in DTYPES:
    for opname in OPS:
        if dt == np.bool_ and opname == "Average":
            expect_refused(lambda: commlib.reducescatter_async(np.ones((n, 2), bool)), TypeError,
                           "reducescatter bool Average")
            continue
        for dim0 in (0, n, 2 * n + 1, 3 * n - 1, 5 * n + 2):
            for trail in [(), (3,)]:
                for pre, post in (SCALES if dt != np.bool_ else SCALES[:1]):
                    rs_case(dt, opname, dim0, trail, pre, post)
rs_case(np.dtype(np.float64), "Average", 2 * n + 1, (2,), 1.0, 1.0, default_op=True)

# many in flight, synchronized in reverse
hs = []
for k in range(40):
    dt = DTYPES[k % len(DTYPES)]
    opname = "Sum" if dt == np.bool_ else ["Sum", "Average", "Min", "Max", "Product"][k % 5]
    dim0 = n + k % (2 * n)
    ins = [make_input(q, dt, (dim0, 2), opname, tag=("rsasync", k)) for q in range(n)]
    hs.append((commlib.reducescatter_async(ins[r], op=OPS[opname]), ins, opname, dim0, k))
for h, ins, opname, dim0, k in reversed(hs):
    got = commlib.synchronize(h)
    start = sum(rows_of(dim0, n, q) for q in range(r))
    check_result(got, reference_reduce(ins, opname)[start:start + rows_of(dim0, n, r)],
                 f"reducescatter_async #{k}")

# explicit splits: uneven shards, zeros, one rank keeping everything, small and
# big (the shared-memory and MPI paths), scaled, and into out=
SPLITS = {"ragged": lambda q: 2 * q + 1, "zero-first": lambda q: 0 if q == 0 else 3,
          "last-only": lambda q: 5 if q == n - 1 else 0, "big": lambda q: 90_000 * (q + 1)}
for dt in DTYPES:
    for opname in (["Sum"] if dt == np.bool_ else ["Sum", "Max", "Average"]):
        for sname, rows in SPLITS.items():
            if sname == "big" and dt.itemsize < 4:
                continue
            splits = [rows(q) for q in range(n)]
            what = f"reducescatter {dt.name} {opname} splits={sname}"
            ins = [make_input(q, dt, (sum(splits), 2), opname, "int", tag=("rsplit", sname)) for q in range(n)]
            pre, post = (2.0, 0.5) if opname == "Sum" and dt != np.bool_ else (1.0, 1.0)
            full = reference_reduce(ins, opname, pre, post)
            start = sum(splits[:r])
            out = np.zeros((splits[r], 2), dt)
            got = commlib.reducescatter(ins[r], op=OPS[opname], prescale_factor=pre, postscale_factor=post,
                                        splits=splits, out=out)
            check_true(got is out, what + ": returns out")
            check_result(got, full[start:start + splits[r]], what)
got = commlib.reducescatter(np.ones((2 * n, 2)), op=commlib.Sum, splits=np.full(n, 2))
check_result(got, np.full((2, 2), float(n)), "reducescatter with numpy splits")
# bad splits are refused on every rank (nothing sent); splits that differ across ranks fail on every rank
x = np.ones((n, 2))
expect_refused(lambda: commlib.reducescatter_async(x, splits=[1] * (n + 1)), ValueError, "rs splits too long")
expect_refused(lambda: commlib.reducescatter_async(x, splits=[-1] + [1] * (n - 2) + [2]), ValueError,
               "rs negative split")
expect_refused(lambda: commlib.reducescatter_async(x, splits=[n] * n), ValueError, "rs splits not summing to dim0")
expect_refused(lambda: commlib.reducescatter_async(x, splits=[1.5] * n), ValueError, "rs float splits (not truncated)")
expect_refused(lambda: commlib.reducescatter_async(empty, splits=[2 ** 63 - 1] * 2 + [2] + [0] * (n - 3)
                                                   if n >= 3 else [2 ** 63 - 1] * 2), ValueError,
               "rs splits whose sum wraps around")
theirs = [n if q == r else 0 for q in range(n)]
try:
    commlib.reducescatter(x, op=commlib.Sum, splits=theirs, name="rs.splits-differ")
    soft_fail("reducescatter with splits that differ across ranks: nothing was raised")
except commlib.CollectiveMismatchError as e:
    check_true("splits" in str(e), f"the mismatch error names the splits: {e}")
check_result(commlib.reducescatter(x, op=commlib.Sum, splits=[1] * n), np.full((1, 2), float(n)),
             "reducescatter after the splits mismatch")

# big
N = 3_000_001
base = (np.arange(N) % 1021).astype(np.float32)
got = commlib.reducescatter(base + np.float32(r), op=commlib.Sum)
start = sum(rows_of(N, n, q) for q in range(r))
want = (base * np.float32(n) + np.float32(n * (n - 1) // 2))[start:start + rows_of(N, n, r)]
check_result(got, want, "big reducescatter")

finish()

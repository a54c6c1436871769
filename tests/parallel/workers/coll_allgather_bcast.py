"""allgather (dimension 0 differs per rank, including ranks with 0 rows) and
broadcast (every root, in place and out of place) for every dtype."""
import numpy as np

import commlib
from coll_common import (DTYPES, Ledger, check_result, check_true, finish, make_input)

commlib.init()
r, n = commlib.rank(), commlib.size()
ledger = Ledger()

# ------------------------------------------------------------------ allgather
ROWS = {
    "q%3": lambda q: q % 3,                      # rank 0 sends nothing
    "2(q+1)": lambda q: 2 * (q + 1),
    "all-empty": lambda q: 0,
    "last-only": lambda q: 3 if q == n - 1 else 0,
    "first-only": lambda q: 1 if q == 0 else 0,
}
TRAILING = [(), (3,), (2, 4), (0,)]

for dt in DTYPES:
    for rname, rows in ROWS.items():
        for trail in TRAILING:
            what = f"allgather {dt.name} rows={rname} trailing={trail}"
            ins = [make_input(q, dt, (rows(q),) + trail, "Sum", "int", tag="ag") for q in range(n)]
            mine = ins[r].copy()
            got = commlib.allgather(mine)
            check_result(got, np.concatenate(ins, axis=0), what)
            check_result(mine, ins[r], what + ": input modified")
            ledger.record(what, got)

# many allgathers in flight, synchronized in reverse
hs = []
for k in range(60):
    dt = DTYPES[k % len(DTYPES)]
    ins = [make_input(q, dt, ((q + k) % 4, 2), tag=("agasync", k)) for q in range(n)]
    hs.append((commlib.allgather_async(ins[r]), ins, k))
for h, ins, k in reversed(hs):
    got = commlib.synchronize(h)
    check_result(got, np.concatenate(ins), f"allgather_async #{k}")
    ledger.record(f"allgather_async #{k}", got)

# big: several MB in total, uneven
big_rows = lambda q: 250_000 * (q + 1) + q  # noqa: E731
mine = (np.arange(big_rows(r) * 2, dtype=np.float32) + r * 0.5).reshape(-1, 2)
got = commlib.allgather(mine)
want = np.concatenate([(np.arange(big_rows(q) * 2, dtype=np.float32) + q * 0.5).reshape(-1, 2)
                       for q in range(n)])
check_result(got, want, "big allgather")
ledger.record("big allgather", got)

# ------------------------------------------------------------------ allgather into out=
# out of place and in place (the input is this rank's own part of out), small
# and big (the shared-memory and the MPI paths), uneven rows, every dtype
from _common import expect_raises  # noqa: E402

for dt in DTYPES:
    for rname, rows in (("2(q+1)", ROWS["2(q+1)"]), ("q%3", ROWS["q%3"]), ("big", lambda q: 70_000 * (q + 1))):
        ins = [make_input(q, dt, (rows(q), 3), tag=("agout", rname)) for q in range(n)]
        want = np.concatenate(ins, axis=0)
        out = np.zeros_like(want)
        mine = ins[r].copy()
        got = commlib.allgather(mine, out=out)
        check_true(got is out, f"allgather out= {dt.name} {rname}: returns out")
        check_result(out, want, f"allgather out= {dt.name} {rname}")
        check_result(mine, ins[r], f"allgather out= {dt.name} {rname}: input modified")
        lo = sum(rows(q) for q in range(r))
        inplace = np.zeros_like(want)
        inplace[lo:lo + rows(r)] = ins[r]
        h = commlib.allgather_async(inplace[lo:lo + rows(r)], out=inplace)
        check_result(commlib.synchronize(h), want, f"allgather in place {dt.name} {rname}")
        ledger.record(f"allgather out= {dt.name} {rname}", out)

# an input overlapping out elsewhere than its own part is read before out is written
buf = np.arange(4 * n * 2, dtype=np.float64).reshape(4 * n, 2) + 100 * r
src = buf[1:5].copy()
got = commlib.allgather(buf[1:5], out=buf)
check_result(got, np.concatenate([np.arange(8, dtype=np.float64).reshape(4, 2)[0:4] + 2 + 100 * q
                                  for q in range(n)]), "allgather with an overlapping input")
check_true(np.array_equal(src, np.arange(8, dtype=np.float64).reshape(4, 2) + 2 + 100 * r), "overlap setup")

# a wrong out fails on its rank alone (the others get their result), and the job goes on
x = np.full((2, 3), float(r), np.float32)
if r == n - 1:
    expect_raises(ValueError, lambda: commlib.allgather(x, out=np.zeros((2 * n + 1, 3), np.float32),
                                                        name="ag.wrong-rows"),
                  "allgather into an out with the wrong rows", match="rows add up to")
else:
    got = commlib.allgather(x, out=np.zeros((2 * n, 3), np.float32), name="ag.wrong-rows")
    check_result(got, np.repeat(np.arange(n, dtype=np.float32), 2)[:, None] * np.ones(3, np.float32),
                 "allgather beside a rank with a wrong out")
expect_raises(TypeError, lambda: commlib.allgather(x, out=np.zeros((2 * n, 3), np.float64)),
              "allgather into an out of another dtype", match="dtype")
expect_raises(ValueError, lambda: commlib.allgather(x, out=np.zeros((2 * n, 4), np.float32)),
              "allgather into an out of other trailing dimensions", match="shape")
expect_raises(ValueError, lambda: commlib.allgather(x, out=np.zeros((3, 2 * n), np.float32).T),
              "allgather into a non-contiguous out", match="C-contiguous")
got = commlib.allgather(x, out=np.zeros((2 * n, 3), np.float32), name="ag.after")
check_result(got[::2, 0], np.arange(n, dtype=np.float32), "allgather after the errors")

# ------------------------------------------------------------------ broadcast
SHAPES = [(0,), (1,), (5,), (3, 4), (2, 3, 2)]
for dt in DTYPES:
    for root in range(n):
        for shape in SHAPES:
            src = [make_input(q, dt, shape, "Sum", "int", tag=("bc", root)) for q in range(n)]
            what = f"broadcast {dt.name} root={root} shape={shape}"
            mine = src[r].copy()
            got = commlib.broadcast(mine, root_rank=root)
            check_result(got, src[root], what)
            check_result(mine, src[r], what + ": input modified by the out-of-place form")
            check_true(not np.shares_memory(got, mine) or got.size == 0,
                       f"{what}: result shares memory with the input")
            ledger.record(what, got)
            mine = src[r].copy()
            ret = commlib.broadcast_(mine, root_rank=root)
            check_true(ret is mine, f"broadcast_ {what}: did not return the array it was given")
            check_result(mine, src[root], "in place " + what)
            ledger.record("in place " + what, mine)
        # numpy integer type as root_rank
        x = make_input(r, dt, (4,), tag="npint")
        got = commlib.broadcast(x, root_rank=np.int64(root))
        check_result(got, make_input(root, dt, (4,), tag="npint"), f"broadcast root=np.int64({root})")

# every root in flight at once, out of place and in place mixed
hs = []
for k in range(4 * n):
    root = k % n
    dt = DTYPES[k % len(DTYPES)]
    src = [make_input(q, dt, (k + 1, 2), tag=("bcasync", k)) for q in range(n)]
    mine = src[r].copy()
    h = commlib.broadcast_async_(mine, root) if k % 2 else commlib.broadcast_async(mine, root)
    hs.append((h, mine, src, root, k))
for h, mine, src, root, k in reversed(hs):
    got = commlib.synchronize(h)
    check_result(got, src[root], f"broadcast_async #{k} root={root}")
    check_result(mine, src[root] if k % 2 else src[r], f"broadcast_async #{k} input/in-place array")
    ledger.record(f"broadcast_async #{k}", got)

# big
N = 3_000_000
root = n - 1
mine = np.full(N, r, dtype=np.float32) if r != root else np.arange(N, dtype=np.float32)
commlib.broadcast_(mine, root)
check_result(mine, np.arange(N, dtype=np.float32), "big broadcast_")
ledger.record("big broadcast", mine)
mine = np.full(N // 3, r + 7, dtype=np.int64)
got = commlib.broadcast(mine, 0)
check_result(got, np.full(N // 3, 7, dtype=np.int64), "big broadcast")
check_result(mine, np.full(N // 3, r + 7, dtype=np.int64), "big broadcast: input unchanged")

finish(ledger)

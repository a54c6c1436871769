"""Many collectives in flight at once: the core negotiates and fuses them
(fused results must equal the unfused reference). Handles are synchronized in
reverse order of submission; grouped_allreduce; other collectives mixed in."""
import numpy as np

import commlib
from coll_common import (DTYPES, OPS, Ledger, check_result, check_true, finish, make_input,
                         reference_reduce, rows_of, soft_raises)

commlib.init()
r, n = commlib.rank(), commlib.size()
ledger = Ledger()
rng = np.random.default_rng(1234)  # same sequence of cases on every rank

SHAPES = [(), (0,), (1,), (3,), (n + 1,), (2, 3), (17,), (5, 0), (64,), (4, 4, 2)]
SCALES = [(1.0, 1.0), (2.0, 1.0), (1.0, 0.5)]


def build_cases(count, tag):
    cases = []
    for i in range(count):
        dt = DTYPES[int(rng.integers(len(DTYPES)))]
        ops = [o for o in OPS if not (dt == np.bool_ and o == "Average")]
        opname = ops[int(rng.integers(len(ops)))]
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        pre, post = SCALES[int(rng.integers(len(SCALES)))] if dt != np.bool_ else (1.0, 1.0)
        inplace = bool(rng.integers(2))
        inputs = [make_input(q, dt, shape, opname, "int", tag=(tag, i)) for q in range(n)]
        cases.append((i, dt, opname, shape, pre, post, inplace, inputs))
    return cases


def submit(case, name=None):
    i, dt, opname, shape, pre, post, inplace, inputs = case
    kw = dict(op=OPS[opname], prescale_factor=pre, postscale_factor=post, name=name)
    mine = inputs[r].copy()
    if inplace:
        return commlib.allreduce_async_(mine, **kw), mine
    return commlib.allreduce_async(mine, **kw), mine


def verify(case, got, mine, prefix):
    i, dt, opname, shape, pre, post, inplace, inputs = case
    what = f"{prefix} #{i} {dt.name} {opname} shape={shape} pre={pre} post={post} inplace={inplace}"
    want = reference_reduce(inputs, opname, pre, post)
    if inplace:
        check_true(got is mine, f"{what}: in-place result is not the given array")
        check_result(mine, want, what + " (array written in place)")
    else:
        check_result(mine, inputs[r], what + ": input modified")
        if shape == ():
            # compare the value here; coll_scalars checks the shape of 0-d results
            got = np.asarray(got).reshape(())
    check_result(got, want, what)
    ledger.record(what, got)


# 1. 200 small tensors of mixed dtypes/ops/scales, then synchronize in reverse.
cases = build_cases(200, "burst")
submitted = [submit(c) for c in cases]
for case, (h, mine) in reversed(list(zip(cases, submitted))):
    verify(case, commlib.synchronize(h), mine, "burst")
for h, _ in submitted:
    check_true(commlib.poll(h), "poll of a synchronized handle is not True")
    soft_raises(ValueError, lambda: commlib.synchronize(h), "second synchronize")

# 2. The same with explicit names, synchronized in a shuffled order, with a big
#    tensor and other collectives in flight in between.
cases = build_cases(150, "named")
order = np.random.default_rng(99).permutation(len(cases))
submitted = {}
big_in = (np.arange(1_500_000) % 997).astype(np.float32) + np.float32(r)
big_h = commlib.allreduce_async(big_in, op=commlib.Sum, name="big.one")
ag_rows = (r * 3) % 4
ag_h = commlib.allgather_async(np.full((ag_rows, 2), r, np.int32), name="ag.mixed")
bc_in = np.arange(10, dtype=np.float64) * (r + 1)
bc_h = commlib.broadcast_async(bc_in, root_rank=n - 1, name="bc.mixed")
rs_in = np.arange(2 * n + 1, dtype=np.int64) * (r + 1)
rs_h = commlib.reducescatter_async(rs_in, op=commlib.Sum, name="rs.mixed")
a2a_h = commlib.alltoall_async(np.arange(2 * n, dtype=np.int32) + 100 * r, name="a2a.mixed")
for k, case in enumerate(cases):
    submitted[k] = submit(case, name=f"t.{k}")
for k in order:
    h, mine = submitted[k]
    verify(cases[k], commlib.synchronize(h), mine, "named")
got = commlib.synchronize(big_h)
want = (np.arange(1_500_000) % 997).astype(np.float32) * np.float32(n) + np.float32(n * (n - 1) // 2)
check_result(got, want, "big allreduce in flight with small ones")
ledger.record("big", got)
got = commlib.synchronize(a2a_h)
check_result(got, np.concatenate([np.arange(2 * n, dtype=np.int32)[2 * r:2 * r + 2] + 100 * q
                                  for q in range(n)]), "alltoall in flight")
got = commlib.synchronize(rs_h)
full = np.arange(2 * n + 1, dtype=np.int64) * (n * (n + 1) // 2)
start = sum(rows_of(2 * n + 1, n, q) for q in range(r))
check_result(got, full[start:start + rows_of(2 * n + 1, n, r)], "reducescatter in flight")
got = commlib.synchronize(bc_h)
check_result(got, np.arange(10, dtype=np.float64) * n, "broadcast in flight")
got = commlib.synchronize(ag_h)
check_result(got, np.concatenate([np.full(((q * 3) % 4, 2), q, np.int32) for q in range(n)]),
             "allgather in flight")

# 3. grouped_allreduce (one handle for the group; synchronize returns the
#    list of results): mixed dtypes and shapes, default op (Average), Sum,
#    Max; in place; scaled; two groups in flight synchronized in reverse.
for opname in ("Average", "Sum", "Max"):
    dts = [d for d in DTYPES if not (d == np.bool_ and opname == "Average")]
    shapes = [(3,), (0,), (2, 5), (n,), (1,), (9,), (4, 2), (7,), (6,)]
    ins = [[make_input(q, d, s, opname, "int", tag="grp") for q in range(n)]
           for d, s in zip(dts, shapes)]
    kw = {} if opname == "Average" else {"op": OPS[opname]}
    outs = commlib.grouped_allreduce([x[r] for x in ins], **kw)
    check_true(len(outs) == len(ins), f"grouped {opname}: {len(outs)} results for {len(ins)} tensors")
    for k, (x, got) in enumerate(zip(ins, outs)):
        what = f"grouped {opname} #{k} {x[0].dtype.name}"
        check_result(got, reference_reduce(x, opname), what)
        check_result(x[r], make_input(r, x[r].dtype, x[r].shape, opname, "int", tag="grp"),
                     what + ": input modified")
        ledger.record(what, got)

    mine = [x[r].copy() for x in ins]
    outs = commlib.grouped_allreduce_(mine, name=f"grp.inplace.{opname}", **kw)
    for k, (x, m, got) in enumerate(zip(ins, mine, outs)):
        what = f"grouped_ {opname} #{k} {x[0].dtype.name}"
        check_true(got is m, f"{what}: in-place result is not the given array")
        check_result(m, reference_reduce(x, opname), what)
        ledger.record(what, m)

    # out=: the results written into given arrays, which are returned
    given = [np.full(x[r].shape, 7, x[r].dtype) for x in ins]
    outs = commlib.grouped_allreduce([x[r] for x in ins], out=given, name=f"grp.out.{opname}", **kw)
    for k, (x, g, got) in enumerate(zip(ins, given, outs)):
        what = f"grouped out= {opname} #{k} {x[0].dtype.name}"
        check_true(got is g, f"{what}: the result is not the given array")
        check_result(g, reference_reduce(x, opname), what)
        ledger.record(what, g)
    x0 = ins[0]
    single = np.empty_like(x0[r])
    got = commlib.allreduce(x0[r], out=single, name=f"out.{opname}", **kw)
    check_true(got is single, f"allreduce out= {opname}: the result is not the given array")
    check_result(single, reference_reduce(x0, opname), f"allreduce out= {opname}")
    ledger.record(f"allreduce out= {opname}", single)

    # scaled (no bool: bool cannot be scaled), two groups in flight
    sins = [x for x in ins if x[0].dtype != np.bool_]
    hs = [commlib.grouped_allreduce_async([x[r] for x in sins], op=OPS[opname],
                                          prescale_factor=2.0, postscale_factor=0.5)
          for _ in range(2)]
    for j, h in enumerate(reversed(hs)):
        outs = commlib.synchronize(h)
        for k, (x, got) in enumerate(zip(sins, outs)):
            what = f"grouped async {opname} #{k} {x[0].dtype.name} round {j}"
            check_result(got, reference_reduce(x, opname, 2.0, 0.5), what)
            ledger.record(what, got)

# out= that cannot take the result: refused on every rank before anything is sent
a = np.arange(12, dtype=np.float32).reshape(3, 4)
readonly = np.empty_like(a)
readonly.flags.writeable = False
for bad, exc, why in [(np.empty((3, 4), np.float64), TypeError, "dtype"),
                      (np.empty((4, 3), np.float32), ValueError, "shape"),
                      (np.empty((3, 8), np.float32)[:, ::2], ValueError, "strided"),
                      (readonly, ValueError, "read-only"), ([1.0] * 12, TypeError, "a list")]:
    soft_raises(exc, lambda: commlib.allreduce(a, out=bad), f"allreduce out= {why}")
    soft_raises(exc, lambda: commlib.grouped_allreduce([a, a], out=[np.empty_like(a), bad]),
                f"grouped_allreduce out= {why}")
soft_raises(ValueError, lambda: commlib.grouped_allreduce([a, a], out=[np.empty_like(a)]),
            "grouped_allreduce out= one array short")
# an in-place group whose layout is cached, one of its arrays made read-only since (once written into)
g1, g2 = np.ones(4), np.ones(3)
commlib.grouped_allreduce_([g1, g2], op=commlib.Sum, name="group.ro")
g1.flags.writeable = False
soft_raises(ValueError, lambda: commlib.grouped_allreduce_([g1, g2], op=commlib.Sum, name="group.ro"),
            "grouped_allreduce_ into an array made read-only after a first call")
check_result(g1, np.full(4, float(n)), "the read-only array left as it was")

# 4. Repeated bursts reuse the fusion buffer with different layouts.
for rep in range(5):
    cases = build_cases(40, ("rep", rep))
    submitted = [submit(c) for c in cases]
    for case, (h, mine) in zip(cases, submitted):
        verify(case, commlib.synchronize(h), mine, f"rep{rep}")

finish(ledger)

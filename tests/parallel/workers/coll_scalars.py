"""0-d (scalar) tensors: allreduce/broadcast keep the shape () in every form
(in-place, out-of-place, async, grouped, numpy scalars); allgather, alltoall
and reducescatter refuse them with ValueError on every rank."""
import numpy as np

import commlib
from coll_common import (DTYPES, OPS, Ledger, check_result, expect_refused, finish, make_input,
                         reference_reduce)

commlib.init()
r, n = commlib.rank(), commlib.size()
ledger = Ledger()

for dt in DTYPES:
    for opname in OPS:
        if dt == np.bool_ and opname == "Average":
            continue
        ins = [make_input(q, dt, (), opname, tag="0d") for q in range(n)]
        want = reference_reduce(ins, opname)
        check_result(ins[r], ins[r], "make_input gives a 0-d array")
        what = f"0-d {dt.name} {opname}"
        got = commlib.allreduce(ins[r], op=OPS[opname])
        check_result(got, want, f"allreduce {what}")
        ledger.record(f"allreduce {what}", got)
        got = commlib.synchronize(commlib.allreduce_async(ins[r], op=OPS[opname]))
        check_result(got, want, f"allreduce_async {what}")
        mine = ins[r].copy()
        commlib.allreduce_(mine, op=OPS[opname])
        check_result(mine, want, f"allreduce_ {what}")
        ledger.record(f"allreduce_ {what}", mine)
    # numpy scalar (not an array) as input
    scalar = make_input(r, dt, (), "Max", tag="scalar")[()]
    want = reference_reduce([make_input(q, dt, (), "Max", tag="scalar") for q in range(n)], "Max")
    check_result(commlib.allreduce(scalar, op=commlib.Max), want, f"allreduce of a numpy scalar {dt.name}")

    root = n - 1
    src = [make_input(q, dt, (), tag="bc0d") for q in range(n)]
    got = commlib.broadcast(src[r], root_rank=root)
    check_result(got, src[root], f"broadcast 0-d {dt.name}")
    mine = src[r].copy()
    commlib.broadcast_(mine, root_rank=root)
    check_result(mine, src[root], f"broadcast_ 0-d {dt.name}")
    ledger.record(f"broadcast 0-d {dt.name}", mine)

# Python scalars
check_result(commlib.allreduce(1.5 * (r + 1), op=commlib.Sum), np.asarray(1.5 * n * (n + 1) / 2),
             "allreduce of a Python float")
check_result(commlib.allreduce(r + 1, op=commlib.Max), np.asarray(n),
             "allreduce of a Python int")

# grouped, with 0-d members
ins = [[np.asarray(q + k, dtype=np.float64) for q in range(n)] for k in range(3)]
outs = commlib.grouped_allreduce([x[r] for x in ins], op=commlib.Sum)
for k, got in enumerate(outs):
    check_result(got, reference_reduce(ins[k], "Sum"), f"grouped 0-d #{k}")

x0 = np.asarray(3.0)
expect_refused(lambda: commlib.allgather_async(x0), ValueError, "allgather of a 0-d array")
expect_refused(lambda: commlib.alltoall_async(x0), ValueError, "alltoall of a 0-d array")
expect_refused(lambda: commlib.alltoall_async(x0, splits=[1] + [0] * (n - 1)), ValueError,
               "alltoall of a 0-d array with splits")
expect_refused(lambda: commlib.reducescatter_async(x0), ValueError, "reducescatter of a 0-d array")
# the job goes on after the refused calls
check_result(commlib.allreduce(np.ones(2), op=commlib.Sum), np.full(2, float(n)), "allreduce after refusals")

finish(ledger)

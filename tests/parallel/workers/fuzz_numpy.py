"""Hypothesis-driven fuzzing of the numpy API's collectives on every rank:
allreduce (every dtype and op, 0-d to 3-d shapes, scale factors, in place
or not), allgather with a different first dimension on each rank, broadcast
from any root, alltoall with random splits (or even ones), reducescatter.

Every rank draws the same examples (derandomize=True, no example database,
no shrinking: a shrink on one rank only would desynchronise the ranks), and
proves it by exchanging each example's description through mpi4py before
running it. Each rank builds every rank's deterministic input
(coll_common.make_input), computes the expected result with numpy and checks
its own. A failed check is recorded and the run goes on (every rank keeps
submitting the same collectives); finish() then exits non-zero.

usage: fuzz_numpy.py EXAMPLES_PER_COLLECTIVE
"""
import sys

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import commlib
from coll_common import (DTYPES, OPS, Ledger, check_result, finish, is_float, make_input,
                         reference_reduce, rows_of, soft_fail, submit_agreed, tolerance)

commlib.init()
r, n = commlib.rank(), commlib.size()
ledger = Ledger()
examples = [0]
FUZZ = settings(max_examples=int(sys.argv[1]), derandomize=True, database=None, deadline=None,
                phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                print_blob=False)

dtypes = st.sampled_from(DTYPES)
ops = st.sampled_from(sorted(OPS))


def shapes(min_dims, max_dims, max_side=4):
    return st.lists(st.integers(0, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


def scales(dt):
    if dt == np.bool_:
        return st.just((1.0, 1.0))
    return st.sampled_from([(1.0, 1.0), (2.0, 1.0), (1.0, 0.5),
                            (1.5 if dt == np.uint8 else -1.5, 0.25)])


def reduction(data, dt):
    """(prescale, postscale, kind of input values) for a reduction of ``dt``."""
    pre, post = data.draw(scales(dt))
    return pre, post, data.draw(st.sampled_from(["int", "rand"] if is_float(dt) else ["int"]))


def same_example(description: str) -> bool:
    """Whether every rank drew this example (checked through mpi4py)."""
    examples[0] += 1
    drawn = MPI.COMM_WORLD.allgather(description)
    if any(d != description for d in drawn):
        soft_fail(f"ranks drew different examples: {drawn}")
        return False
    return True


def run(what, submit, check, refused=None):
    """Submit on every rank; check the result, or that every rank refused
    with ``refused`` (an exception type) when one is given."""
    handle, err = submit_agreed(submit, what)
    if refused is not None or err is not None:
        if refused is None or not isinstance(err, refused):
            soft_fail(f"{what}: expected {refused and refused.__name__}, got {err!r}")
        return
    try:
        check(commlib.synchronize(handle))
    except Exception as e:  # noqa: BLE001 - recorded; the ranks go on together
        soft_fail(f"{what}: {type(e).__name__}: {e}")


def inputs(dt, shapes_, op="Sum", kind="int", tag=""):
    return [make_input(q, dt, s, op, kind, tag) for q, s in enumerate(shapes_)]


@FUZZ
@given(dt=dtypes, op=ops, shape=shapes(0, 3), data=st.data(), inplace=st.booleans())
def fuzz_allreduce(dt, op, shape, data, inplace):
    pre, post, kind = reduction(data, dt)
    what = f"allreduce{'_' if inplace else ''} {dt.name} {op} {shape} pre={pre} post={post} {kind}"
    if not same_example(what):
        return
    ins = inputs(dt, [shape] * n, op, kind, what)
    bad = dt == np.bool_ and op == "Average"
    fn = commlib.allreduce_async_ if inplace else commlib.allreduce_async
    mine = ins[r].copy()

    def check(got):
        want = reference_reduce(ins, op, pre, post)
        check_result(got, want, what, *tolerance(dt, kind))
        if inplace:
            check_result(mine, want, what + " (in place)", *tolerance(dt, kind))
        ledger.record(what, got)

    run(what, lambda: fn(mine, op=OPS[op], prescale_factor=pre, postscale_factor=post), check,
        TypeError if bad else None)


@FUZZ
@given(dt=dtypes, trail=shapes(0, 2, 3), dims=st.lists(st.integers(0, 4), min_size=n, max_size=n))
def fuzz_allgather(dt, trail, dims):
    what = f"allgather {dt.name} first dims {dims} trailing {trail}"
    if not same_example(what):
        return
    ins = inputs(dt, [(d,) + trail for d in dims], tag=what)

    def check(got):
        check_result(got, np.concatenate(ins), what)
        ledger.record(what, got)

    run(what, lambda: commlib.allgather_async(ins[r]), check)


@FUZZ
@given(dt=dtypes, shape=shapes(0, 3), root=st.integers(0, n - 1), inplace=st.booleans())
def fuzz_broadcast(dt, shape, root, inplace):
    what = f"broadcast{'_' if inplace else ''} {dt.name} {shape} root {root}"
    if not same_example(what):
        return
    ins = inputs(dt, [shape] * n, tag=what)
    fn = commlib.broadcast_async_ if inplace else commlib.broadcast_async
    mine = ins[r].copy()

    def check(got):
        check_result(got, ins[root], what)
        if inplace:
            check_result(mine, ins[root], what + " (in place)")
        ledger.record(what, got)

    run(what, lambda: fn(mine, root), check)


@FUZZ
@given(dt=dtypes, trail=shapes(0, 2, 3), even=st.integers(-1, 2),
       splits=st.lists(st.lists(st.integers(0, 3), min_size=n, max_size=n), min_size=n,
                       max_size=n))
def fuzz_alltoall(dt, trail, even, splits):
    if even >= 0:  # no splits: `even` rows to each rank
        splits = [[even] * n for _ in range(n)]
    what = f"alltoall {dt.name} splits {'even' if even >= 0 else splits} trailing {trail}"
    if not same_example(what):
        return
    ins = inputs(dt, [(sum(s),) + trail for s in splits], tag=what)
    parts = [ins[q][sum(splits[q][:r]):sum(splits[q][:r + 1])] for q in range(n)]
    want_splits = [splits[q][r] for q in range(n)]

    def check(got):
        if even < 0:  # with splits: (rows, rows received from each rank)
            got, got_splits = got
            check_result(got_splits, np.asarray(want_splits, dtype=np.int64), what + " splits")
        check_result(got, np.concatenate(parts), what)

    run(what, lambda: commlib.alltoall_async(ins[r], None if even >= 0 else splits[r]), check)


@FUZZ
@given(dt=dtypes, op=ops, dim0=st.integers(0, 2 * n + 1), trail=shapes(0, 2, 3), data=st.data())
def fuzz_reducescatter(dt, op, dim0, trail, data):
    pre, post, kind = reduction(data, dt)
    what = f"reducescatter {dt.name} {op} dim0 {dim0} trailing {trail} pre={pre} post={post} {kind}"
    if not same_example(what):
        return
    ins = inputs(dt, [(dim0,) + trail] * n, op, kind, what)
    start = sum(rows_of(dim0, n, q) for q in range(r))

    def check(got):
        want = reference_reduce(ins, op, pre, post)[start:start + rows_of(dim0, n, r)]
        check_result(got, want, what, *tolerance(dt, kind))

    run(what, lambda: commlib.reducescatter_async(ins[r], op=OPS[op], prescale_factor=pre,
                                                  postscale_factor=post), check,
        TypeError if dt == np.bool_ and op == "Average" else None)


for fuzz in (fuzz_allreduce, fuzz_allgather, fuzz_broadcast, fuzz_alltoall, fuzz_reducescatter):
    fuzz()
counts = MPI.COMM_WORLD.allgather(examples[0])
if len(set(counts)) != 1:
    soft_fail(f"ranks ran different numbers of examples: {counts}")
print(f"rank {r}: {examples[0]} examples run", flush=True)
finish(ledger)

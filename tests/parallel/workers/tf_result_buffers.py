"""The reused result buffers of commlib.tensorflow (frontends/tensorflow/
buffers.py) on every rank: the allreduce and grouped allreduce ops' results
and delayed averaging's (DelayedGradients). A result the caller keeps (eagerly,
or a tf.function's outputs) is never overwritten by later steps, whose
results are right too (checked against numpy); and when the results are let
go, the same buffers carry every later step (no allocation per step)."""
import numpy as np
import tensorflow as tf
from tf_common import done, fail

import commlib.tensorflow as htf
import commlib.tensorflow.buffers as buffers

r, n = htf.rank(), htf.size()
SHAPES = [(300, 70), (7,)]
allocated = []
_real = buffers.aligned_empty
buffers.aligned_empty = lambda shape, dtype: allocated.append(shape) or _real(shape, dtype)


def grads(step):
    return [tf.fill(s, float(r) + 10 * step) for s in SHAPES]


def expected(step):  # the average over ranks of r + 10 * step
    return [np.full(s, (n - 1) / 2 + 10 * step, np.float32) for s in SHAPES]


def check(avg, step, what):
    for got, want in zip(avg, expected(step)):
        if not np.array_equal(np.asarray(got), want):
            fail(f"{what}: the average of step {step} reads {np.asarray(got).ravel()[:3]}, "
                 f"expected {want.ravel()[:3]}")


def run(swap, what, steps=8):
    """Keeps every other step's average, drops the rest; checks them all at the end."""
    kept = {}
    for step in range(steps):
        have, avg = swap(grads(step))
        if bool(have):
            check(avg, step - 1, f"{what}, as returned")
            if step % 2:
                kept[step - 1] = avg
    for step, avg in kept.items():
        check(avg, step, f"{what}, kept for later steps")


ex = htf.DelayedGradients()
run(ex.swap, "eager")
ex.finish()
graph_ex = htf.DelayedGradients()
run(tf.function(graph_ex.swap), "tf.function")
graph_ex.finish()


def grouped(values):
    return htf.grouped_allreduce(values, op=htf.Average)


def single(values):
    return [htf.allreduce(v, op=htf.Average) for v in values]


def run_reduce(reduce, what, steps=8):
    """As run(), for a collective that returns this step's results."""
    kept = {}
    for step in range(steps):
        out = reduce(grads(tf.constant(step, tf.float32)))
        check(out, step, f"{what}, as returned")
        if step % 2:
            kept[step] = out
    for step, out in kept.items():
        check(out, step, f"{what}, kept for later steps")


for fn, what in [(grouped, "grouped_allreduce"), (single, "allreduce")]:
    run_reduce(fn, f"{what}, eager")
    run_reduce(tf.function(fn), f"{what}, tf.function")


def released(step_fn, what):
    """Ten steps whose results are let go: at most two sets of buffers."""
    allocated.clear()
    for step in range(10):
        out = step_fn(grads(tf.constant(step, tf.float32)))
        del out
    if len(allocated) > 2 * len(SHAPES):
        fail(f"{what}: {len(allocated)} buffers allocated over 10 steps whose results were let "
             f"go (expected at most {2 * len(SHAPES)}: two sets in turn)")


released(htf.DelayedGradients().swap, "delayed")
released(tf.function(htf.DelayedGradients().swap), "delayed, tf.function")
released(tf.function(grouped), "grouped_allreduce, tf.function")
released(tf.function(single), "allreduce, tf.function")
done()

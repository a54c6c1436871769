"""The buffers behind TensorFlow's delayed averaging (commlib.tensorflow.
delayed.DelayedExchange) on every rank: an average the caller keeps (eagerly,
or a tf.function's outputs) is never overwritten by later steps, whose
averages are right too (checked against numpy); and when the averages are
let go, the same buffers carry every later step (no allocation per step)."""
import numpy as np
import tensorflow as tf
from tf_common import done, fail

import commlib.tensorflow as htf
import commlib.tensorflow.delayed as delayed

r, n = htf.rank(), htf.size()
SHAPES = [(300, 70), (7,)]
allocated = []
_real = delayed._aligned_empty
delayed._aligned_empty = lambda shape, dtype: allocated.append(shape) or _real(shape, dtype)


def grads(step):
    return [tf.fill(s, float(r + 10 * step)) for s in SHAPES]


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


ex = delayed.DelayedExchange()
run(ex.swap_op, "eager")
ex.finish()
graph_ex = delayed.DelayedExchange()
run(tf.function(graph_ex.swap_op), "tf.function")
graph_ex.finish()

# Released averages: the two buffer sets in turn carry every step.
released = delayed.DelayedExchange()
allocated.clear()
for step in range(10):
    have, avg = released.swap_op(grads(step))
    if bool(have):
        check(avg, step - 1, "released")
    del avg
if len(allocated) > 2 * len(SHAPES):
    fail(f"{len(allocated)} buffers allocated over 10 steps whose averages were let go "
         f"(expected at most {2 * len(SHAPES)}: two sets in turn)")
done()

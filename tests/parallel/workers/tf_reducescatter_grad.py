"""Gradients of commlib.tensorflow reducescatter and grouped_reducescatter
are Horovod's, eagerly and inside tf.function, checked on every rank against
exact numbers: the allgather (over the same process set) of the output
gradients, times the set's size for Sum and prescale_factor *
postscale_factor for every op. Every op, with and without scale factors, on
the global set and on ranks 1..n-1, single and grouped forms."""
import numpy as np
import tensorflow as tf
from tf_common import check, done, hvd

r, n = hvd.rank(), hvd.size()
tail = hvd.add_process_set(list(range(1, n)))
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}
SCALES = [(1.0, 1.0), (0.5, 4.0)]  # powers of 2: exact


def rows_of(dim0, m, pos):
    return dim0 // m + (1 if pos < dim0 % m else 0)


def upstream(k, rows, cols=2):
    return np.arange(rows * cols, dtype=np.float64).reshape(rows, cols) % 5 + 10 * k + 1


def horovod_grad(ranks, dim0, op, pre, post, cols=2):
    m = len(ranks)
    scale = (m if op == "Sum" else 1) * pre * post
    return np.concatenate([upstream(k, rows_of(dim0, m, i), cols)
                           for i, k in enumerate(ranks)]) * scale


def run(ps, ranks, tag):
    m, pos = len(ranks), ranks.index(r)
    dim0 = 2 * m + 1
    for mode, wrap in (("eager", lambda f: f), ("graph", tf.function)):
        for opname, op in OPS.items():
            for pre, post in SCALES:
                what = f"{tag} {mode} {opname} pre {pre} post {post}"

                def grads(x, b):
                    with tf.GradientTape() as tape:
                        tape.watch([x, b])
                        y = hvd.reducescatter(x, op=op, process_set=ps, prescale_factor=pre,
                                              postscale_factor=post)
                        ya, yb = hvd.grouped_reducescatter([x, b], op=op, process_set=ps,
                                                           prescale_factor=pre,
                                                           postscale_factor=post)
                        loss = (tf.reduce_sum(y * upstream(r, rows_of(dim0, m, pos)))
                                + 2.0 * tf.reduce_sum(ya * upstream(r, rows_of(dim0, m, pos)))
                                + tf.reduce_sum(yb * upstream(r, 1, 3)))
                    return tape.gradient(loss, [x, b])

                x = tf.constant(np.arange(dim0 * 2).reshape(dim0, 2) % 3 + 1.0, tf.float64)
                gx, gb = wrap(grads)(x, tf.ones([m, 3], tf.float64))
                check(gx, 3 * horovod_grad(ranks, dim0, opname, pre, post), what)
                check(gb, horovod_grad(ranks, m, opname, pre, post, cols=3), f"{what} grouped")


run(None, list(range(n)), "global")
if r in tail.ranks:
    run(tail, tail.ranks, "ranks 1..n-1")
hvd.barrier()
done()

"""commlib.tensorflow's errors as Horovod's, and generated names that stay in
step after them (run with a short COMMLIB_TIMEOUT: names that drift apart
make the next unnamed collectives time out or mismatch).

Each case fails on every rank; each rank checks that its exception is both
commlib's class and the tf.errors class Horovod raises, then runs unnamed
collectives of every kind, eagerly and in a tf.function, against numpy:
- ranks disagree on a shape / a dtype, inside tf.function and eagerly
  (CollectiveMismatchError and FailedPreconditionError on every rank);
- one rank's path goes through tf.function, the others' eagerly (the ops
  have different names: CollectiveTimeoutError and DeadlineExceededError);
- the last rank's own argument is bad (a 0-d tensor to allgather), eagerly and
  while tracing: ScalarTensorError and InvalidArgumentError there, the others
  time out.
"""
import numpy as np

import os
import time

import commlib
from tf_common import check, done, fail, hvd, tf

r, n = hvd.rank(), hvd.size()
last = r == n - 1


def expect(classes, fn, what):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the check is its classes
        missing = [c.__name__ for c in classes if not isinstance(e, c)]
        if missing:
            fail(f"{what}: {type(e).__name__} is not a {', '.join(missing)}: {e}")
        original = getattr(e, "commlib_error", None)
        if type(original) is not classes[0] or str(original).split(" [")[0] not in str(e):
            fail(f"{what}: commlib_error {original!r} is not the {classes[0].__name__} "
                 f"whose message it carries: {e}")
        return e
    fail(f"{what}: nothing was raised")


MISMATCH = (commlib.CollectiveMismatchError, tf.errors.FailedPreconditionError)
TIMEOUT = (commlib.CollectiveTimeoutError, TimeoutError, tf.errors.DeadlineExceededError)
SCALAR = (commlib.ScalarTensorError, ValueError, tf.errors.InvalidArgumentError)


def every_kind():
    """Unnamed collectives of every kind; (what, got, expected) triples."""
    x = tf.constant([r + 1.0, 2.0 * r])
    rows = tf.fill([r + 1, 2], float(r))
    a2a = tf.constant([[10.0 * r + j] for j in range(n)])
    rs = tf.reshape(tf.range(2 * n, dtype=tf.float32), [n, 2]) * (r + 1)
    tri = n * (n + 1) / 2
    want_rows = np.concatenate([np.full((s + 1, 2), float(s), np.float32) for s in range(n)])
    rs_want = np.arange(2 * n, dtype=np.float32).reshape(n, 2)[r:r + 1] * tri
    return [
        ("allreduce", hvd.allreduce(x, op=hvd.Sum),
         np.array([tri, n * (n - 1)], np.float32)),
        ("allgather", hvd.allgather(rows), want_rows),
        ("broadcast", hvd.broadcast(x, root_rank=n - 1), np.array([n, 2.0 * (n - 1)], np.float32)),
        ("alltoall", hvd.alltoall(a2a),
         np.array([[10.0 * s + r] for s in range(n)], np.float32)),
        ("reducescatter", hvd.reducescatter(rs, op=hvd.Sum), rs_want),
        ("grouped_allreduce", hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum)[1],
         2 * np.array([tri, n * (n - 1)], np.float32)),
        ("grouped_allgather", hvd.grouped_allgather([rows, 2 * rows])[1], 2 * want_rows),
        ("grouped_reducescatter", hvd.grouped_reducescatter([rs], op=hvd.Sum)[0], rs_want),
    ]


graph_kinds = tf.function(every_kind)


def still_in_step(tag):
    for mode, fn in (("eager", every_kind), ("tf.function", graph_kinds)):
        for what, got, want in fn():
            check(got, want, f"{what} ({mode}) after {tag}")


@tf.function
def gather_in_graph(t):
    return hvd.allgather(t)


@tf.function
def sum_in_graph(t):
    return hvd.allreduce(t, op=hvd.Sum)


def dtype_by_rank():
    return tf.ones([3], tf.float64 if last else tf.float32)


cases = [
    ("shape mismatch in tf.function", MISMATCH, lambda: gather_in_graph(tf.ones([2, 3 + last]))),
    ("dtype mismatch in tf.function", MISMATCH, lambda: sum_in_graph(dtype_by_rank())),
    ("shape mismatch eagerly", MISMATCH, lambda: hvd.allgather(tf.ones([2, 3 + last]))),
    ("dtype mismatch eagerly", MISMATCH, lambda: hvd.allreduce(dtype_by_rank(), op=hvd.Sum)),
    ("tf.function on rank 0's path only", TIMEOUT,
     lambda: gather_in_graph(tf.ones([2, 3])) if r == 0 else hvd.allgather(tf.ones([2, 4]))),
    ("0-d tensor on the last rank, eagerly", SCALAR if last else TIMEOUT,
     lambda: hvd.allgather(tf.ones([] if last else [2]))),
    ("0-d tensor on the last rank, traced", SCALAR if last else TIMEOUT,
     lambda: tf.function(lambda t: hvd.alltoall(t))(tf.ones([] if last else [n]))),
]

still_in_step("nothing")
for tag, classes, fn in cases:
    e = expect(classes, fn, tag)
    print(f"rank {r}: {tag}: {type(e).__name__} ({', '.join(c.__name__ for c in classes)})",
          flush=True)
    if classes is SCALAR:  # failed at once: the others' collective still waits for its timeout
        time.sleep(float(os.environ["COMMLIB_TIMEOUT"]) + 1)
    still_in_step(tag)
done()

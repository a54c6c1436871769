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
  while tracing: ScalarTensorError and InvalidArgumentError there; the others
  fail at once (CollectiveMismatchError naming the last rank), told by it;
- the last rank's Python checks refuse a call (a root outside the job, a
  complex dtype) that the others make: broadcast, broadcast_variables, a
  sparse allreduce, named and unnamed, eagerly and inside tf.function; the
  others' same call fails at once, naming the last rank and its reason.
"""
import numpy as np

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
    ("0-d tensor on the last rank, eagerly", SCALAR if last else MISMATCH,
     lambda: hvd.allgather(tf.ones([] if last else [2]))),
    ("0-d tensor on the last rank, traced", SCALAR if last else MISMATCH,
     lambda: tf.function(lambda t: hvd.alltoall(t))(tf.ones([] if last else [n]))),
]

BAD_ROOT = n + 3 if last else 0  # (the last rank's root is outside the job)
v1, v2 = tf.Variable([float(r)] * 2), tf.Variable([[r + 0.5]])


@tf.function
def bcast_in_graph(t):
    return hvd.broadcast(t, root_rank=BAD_ROOT)


@tf.function
def bcast_vars_in_graph():
    hvd.broadcast_variables([v1, v2], root_rank=BAD_ROOT)
    return tf.constant(0)


def sparse_sum(name):
    values = tf.ones([2, 2], tf.complex64 if last else tf.float32)
    return hvd.allreduce(tf.IndexedSlices(values, tf.constant([0, r]), tf.constant([n, 2])),
                         op=hvd.Sum, name=name)


# (what, the last rank's refusal, the call)
refusals = [
    ("unnamed broadcast, bad root, eagerly", ValueError, lambda: hvd.broadcast(tf.ones([2]), BAD_ROOT)),
    ("named broadcast, bad root, eagerly", ValueError,
     lambda: hvd.broadcast(tf.ones([2]), BAD_ROOT, name="bc.root")),
    ("broadcast, bad root, traced", ValueError, lambda: bcast_in_graph(tf.ones([2]))),
    ("unnamed broadcast_variables, bad root, eagerly", ValueError,
     lambda: hvd.broadcast_variables([v1, v2], BAD_ROOT)),
    ("named broadcast_variables, bad root, eagerly", ValueError,
     lambda: hvd.broadcast_variables([v1, v2], BAD_ROOT, name="vars")),
    ("broadcast_variables, bad root, traced", ValueError, bcast_vars_in_graph),
    ("unnamed sparse allreduce, complex values", TypeError, lambda: sparse_sum(None)),
    ("named sparse allreduce, complex values", TypeError, lambda: sparse_sum("sp")),
    ("unnamed grouped_allgather, a string tensor", TypeError,
     lambda: hvd.grouped_allgather([tf.ones([2]), tf.constant(["a", "b"]) if last else tf.ones([2])])),
    ("named grouped_allgather, a string tensor", TypeError,
     lambda: hvd.grouped_allgather([tf.ones([2]), tf.constant(["a", "b"]) if last else tf.ones([2])],
                                   name="gag")),
]


def refused_on_last(what, exc, fn):
    start = time.monotonic()
    if last:
        try:
            fn()
        except exc as e:
            if isinstance(e, commlib.CommlibError):
                fail(f"{what}: the last rank's own check should refuse it, got {type(e).__name__}: {e}")
        else:
            fail(f"{what}: the last rank's call was not refused")
        return
    e = expect(MISMATCH, fn, what)
    if f"rank {n - 1} could not submit" not in str(e) or exc.__name__ not in str(e):
        fail(f"{what}: the error does not name rank {n - 1} and its {exc.__name__}: {e}")
    if time.monotonic() - start > 2:  # (COMMLIB_TIMEOUT is 3 s)
        fail(f"{what}: took {time.monotonic() - start:.1f} s: it should fail at once")

still_in_step("nothing")
for tag, classes, fn in cases:
    e = expect(classes, fn, tag)
    print(f"rank {r}: {tag}: {type(e).__name__} ({', '.join(c.__name__ for c in classes)})",
          flush=True)
    still_in_step(tag)
for what, exc, fn in refusals:
    refused_on_last(what, exc, fn)
    print(f"rank {r}: {what}: refused", flush=True)
    still_in_step(what)
check(hvd.broadcast(tf.fill([2], float(r)), 0, name="bc.root"), np.zeros(2, np.float32), "'bc.root' again")  # (names work again)
hvd.broadcast_variables([v1, v2], 0, name="vars")
check(v2, np.full((1, 1), 0.5, np.float32), "broadcast_variables 'vars' again")
check(hvd.grouped_allgather([tf.ones([1]), tf.fill([1], float(r))], name="gag")[1], np.arange(n, dtype=np.float32),
      "grouped_allgather 'gag' again")
got = hvd.allreduce(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([r]), tf.constant([n, 2])), op=hvd.Sum,
                    name="sp")
check(tf.convert_to_tensor(got), np.ones([n, 2], np.float32), "sparse allreduce 'sp' again")
done()

"""commlib.tensorflow collectives, eagerly and inside tf.function, checked
against numpy on every rank: every op x every dtype, gradients, names that
survive retracing, errors (mismatch, dtype, process sets), variables and
objects."""
import numpy as np
import tensorflow as tf
from tf_common import check, done, expect_raises, fail, hvd, np_of

import commlib

r, n = hvd.rank(), hvd.size()
MODES = {"eager": lambda f: f, "graph": tf.function}
DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
          tf.float64, tf.bool]


def val(dtype, rank, rows=3, cols=4):
    """Rank ``rank``'s input (small integers: exact in every dtype)."""
    a = (np.arange(rows * cols).reshape(rows, cols) * (rank + 1) + rank) % 7
    if dtype == tf.bool:
        return a % 2 == 0
    return a.astype(dtype.as_numpy_dtype)


def wide(a):
    return a.astype(np.float64) if a.dtype != np.bool_ else a


def expect_reduce(dtype, op, rows=3):
    xs = [wide(val(dtype, s, rows)) for s in range(n)]
    dt = dtype.as_numpy_dtype
    if dtype == tf.bool:
        return np.logical_or.reduce(xs) if op in ("Sum", "Max") else np.logical_and.reduce(xs)
    if op == "Sum":
        return np.sum(xs, 0).astype(dt)
    if op == "Average":
        avg = np.sum(xs, 0) / n
        return (np.trunc(avg) if dtype.is_integer else avg).astype(dt)
    if op == "Min":
        return np.min(xs, 0).astype(dt)
    return np.max(xs, 0).astype(dt)


def tol(dtype):
    return {tf.float16: 1e-3, tf.bfloat16: 1e-2, tf.float32: 1e-6,
            tf.float64: 1e-12}.get(dtype, 0.0)


# ---------------------------------------------------------------- every op x dtype x mode

for mode, wrap in MODES.items():
    for dtype in DTYPES:
        def all_ops(x, xg, xa, dtype=dtype):
            out = {"Sum": hvd.allreduce(x, op=hvd.Sum), "Max": hvd.allreduce(x, op=hvd.Max),
                   "Min": hvd.allreduce(x, op=hvd.Min)}
            if dtype != tf.bool:
                out["Average"] = hvd.allreduce(x)
                out["grouped"] = hvd.grouped_allreduce([x, x], op=hvd.Sum)
                out["rs"] = hvd.reducescatter(x, op=hvd.Sum)
            out["ag"] = hvd.allgather(xg)
            out["bc"] = hvd.broadcast(x, n - 1)
            out["a2a"], out["a2a_splits"] = hvd.alltoall(xa, splits=list(range(1, n + 1)))
            return out

        f = wrap(all_ops)
        x = tf.constant(val(dtype, r))
        xg = tf.constant(val(dtype, r, rows=r + 1))
        xa = tf.constant(val(dtype, r, rows=n * (n + 1) // 2))
        for rep in range(2):  # a traced function executes again with the same names
            out = f(x, xg, xa)
            what = f"{mode} {dtype.name} run {rep}"
            for op in ("Sum", "Max", "Min", "Average"):
                if op in out:
                    check(out[op], expect_reduce(dtype, op), f"{what} allreduce {op}",
                          rtol=tol(dtype), atol=tol(dtype))
            if "grouped" in out:
                for g in out["grouped"]:
                    check(g, expect_reduce(dtype, "Sum"), f"{what} grouped_allreduce",
                          rtol=tol(dtype))
                rows = [3 // n + (1 if s < 3 % n else 0) for s in range(n)]
                start = sum(rows[:r])
                check(out["rs"], expect_reduce(dtype, "Sum")[start:start + rows[r]],
                      f"{what} reducescatter", rtol=tol(dtype))
            check(out["ag"], np.concatenate([val(dtype, s, rows=s + 1) for s in range(n)]),
                  f"{what} allgather")
            check(out["bc"], val(dtype, n - 1), f"{what} broadcast")
            # rank s sends rows [sum(1..i), +i+1) of its input to rank i
            got = np.concatenate([val(dtype, s, rows=n * (n + 1) // 2)[r * (r + 1) // 2:
                                                                         r * (r + 1) // 2 + r + 1]
                                  for s in range(n)])
            check(out["a2a"], got, f"{what} alltoall")
            check(out["a2a_splits"], np.full(n, r + 1, np.int32), f"{what} alltoall splits")
        if mode == "graph":
            conc = f.get_concrete_function(x, xg, xa)
            outs = conc.structured_outputs
            if outs["ag"].shape.as_list() != [None, 4] or outs["Sum"].shape.as_list() != [3, 4]:
                fail(f"graph {dtype.name}: static shapes {outs['ag'].shape} {outs['Sum'].shape}")

# scalars keep their shape; scale factors; equal-split alltoall; byte-moved dtypes
for mode, wrap in MODES.items():
    @wrap
    def misc():
        s = hvd.allreduce(tf.constant(float(r + 1)), op=hvd.Sum, prescale_factor=2.0,
                          postscale_factor=0.5)
        a2a = hvd.alltoall(tf.reshape(tf.range(2 * n) + 10 * r, [2 * n, 1]))
        bc = hvd.broadcast(tf.constant([r, r + 1], tf.uint32), 0)
        ag = hvd.allgather(tf.constant([complex(r, 1)], tf.complex64))
        fp16 = hvd.allreduce(tf.constant([r + 0.5, 1.0]), compression=hvd.Compression.fp16)
        bcs = hvd.broadcast(tf.constant(r + 7, tf.int16), n - 1)
        return s, a2a, bc, ag, fp16, bcs

    s, a2a, bc, ag, fp16, bcs = misc()
    check(s, np.float32(n * (n + 1) / 2), f"{mode} scalar allreduce with scale factors")
    check(a2a, np.array([[2 * r + 10 * s + j] for s in range(n) for j in range(2)], np.int32),
          f"{mode} alltoall without splits")
    check(bc, np.array([0, 1], np.uint32), f"{mode} broadcast uint32 (as bytes)")
    check(ag, np.array([complex(s, 1) for s in range(n)], np.complex64), f"{mode} allgather c64")
    check(fp16, np.array([(n - 1) / 2 + 0.5, 1.0], np.float32), f"{mode} fp16 compression",
          rtol=1e-3)
    check(bcs, np.int16(n - 1 + 7), f"{mode} broadcast int16 scalar")


# a collective inside a tf.while_loop body runs once per iteration
@tf.function
def loop(x):
    total = tf.zeros_like(x)
    for i in tf.range(3):
        total += hvd.allreduce(x * tf.cast(i + 1, x.dtype), op=hvd.Sum)
    return total


check(loop(tf.constant([1.0, float(r)])), np.array([6.0 * n, 6.0 * sum(range(n))], np.float32),
      "allreduce in a while loop")


# names are fixed at trace time: ranks with different shapes trace different
# graphs (and retrace in a different order) yet meet under the same names
@tf.function
def gather(x):
    return hvd.allgather(x * 2)


for rep in range(2):
    rows = r + 1 if rep == 0 else n - r
    out = gather(tf.ones([rows, 2]))
    total = sum(s + 1 for s in range(n))
    check(out, np.full((total, 2), 2.0, np.float32), f"retraced allgather {rep}")

# ---------------------------------------------------------------- gradients

c = tf.constant([1.0, 2.0, 3.0])
for mode, wrap in MODES.items():
    v = tf.Variable([1.0, -1.0, 0.5])

    @wrap
    def grads():
        out = {}
        for name, op in (("Sum", hvd.Sum), ("Average", hvd.Average)):
            with tf.GradientTape() as t:
                loss = tf.reduce_sum(hvd.allreduce(v * (r + 1), op=op) * c)
            out[name] = t.gradient(loss, v)
        with tf.GradientTape() as t:  # the max is on the last rank
            loss = tf.reduce_sum(hvd.allreduce(v + 10.0 * r, op=hvd.Max) * c)
        out["Max"] = t.gradient(loss, v)
        with tf.GradientTape() as t:
            ys = hvd.grouped_allreduce([v * 2.0, v * (r + 1)], op=hvd.Sum)
            loss = tf.reduce_sum(ys[0] * c) + tf.reduce_sum(ys[1])
        out["grouped"] = t.gradient(loss, v)
        with tf.GradientTape() as t:  # rank r contributes r+1 rows
            x = tf.reshape(tf.tile(v[:2], [r + 1]), [r + 1, 2]) * (r + 1)
            y = hvd.allgather(x)
            w = tf.reshape(tf.range(tf.size(y), dtype=tf.float32), tf.shape(y))
            loss = tf.reduce_sum(y * w)
        out["allgather"] = t.gradient(loss, v)
        with tf.GradientTape() as t:
            loss = tf.reduce_sum(hvd.broadcast(v, n - 1) * c)
        out["broadcast"] = t.gradient(loss, v)
        with tf.GradientTape() as t:  # rows go to ranks in blocks of 2
            x = tf.stack([v[0] * (j + 1) for j in range(2 * n)])
            y = hvd.alltoall(x)
            loss = tf.reduce_sum(y) * (r + 1)
        out["alltoall"] = t.gradient(loss, v)
        with tf.GradientTape() as t:  # rows go to ranks in blocks of 2
            x = tf.stack([v[1] * (j + 1) for j in range(2 * n)])
            y = hvd.reducescatter(x, op=hvd.Average)
            loss = tf.reduce_sum(y) * (r + 1)
        out["reducescatter"] = t.gradient(loss, v)
        return out

    g = grads()
    check(g["Sum"], (r + 1) * n * np_of(c), f"{mode} grad allreduce Sum")
    check(g["Average"], (r + 1) * np_of(c), f"{mode} grad allreduce Average")
    check(g["Max"], np_of(c) * n if r == n - 1 else np.zeros(3, np.float32), f"{mode} grad Max")
    check(g["grouped"], 2 * n * np_of(c) + (r + 1) * n, f"{mode} grad grouped_allreduce")
    # d(sum over ranks of losses)/dx for allgather rows of rank r: n * w[rows of r]
    off = sum(s + 1 for s in range(r)) * 2
    w = np.arange(off, off + 2 * (r + 1), dtype=np.float32).reshape(r + 1, 2)
    want = np.zeros(3, np.float32)
    want[:2] = n * (r + 1) * w.sum(0)
    check(g["allgather"], want, f"{mode} grad allgather")
    check(g["broadcast"], n * np_of(c) if r == n - 1 else np.zeros(3, np.float32),
          f"{mode} grad broadcast")
    want = np.zeros(3, np.float32)
    want[0] = sum((j + 1) * (j // 2 + 1) for j in range(2 * n))  # row j lands on rank j // 2
    check(g["alltoall"], want, f"{mode} grad alltoall")
    want = np.zeros(3, np.float32)
    want[1] = sum((j + 1) * (j // 2 + 1) for j in range(2 * n))  # Horovod's: Average, no 1/n
    check(g["reducescatter"], want, f"{mode} grad reducescatter", rtol=1e-6)

# IndexedSlices (gradient of a gather) are allgathered
emb = tf.Variable(tf.zeros([5, 2]))
with tf.GradientTape() as t:
    loss = tf.reduce_sum(tf.gather(emb, [r % 5, 4]))
sparse = t.gradient(loss, emb)
if not isinstance(sparse, tf.IndexedSlices):
    fail("expected IndexedSlices")
red = hvd.allreduce(sparse, op=hvd.Sum)
dense = np.zeros([5, 2], np.float32)
for s in range(n):
    dense[s % 5] += 1
    dense[4] += 1
check(tf.convert_to_tensor(red), dense, "IndexedSlices allreduce")

# ---------------------------------------------------------------- variables and objects

for mode, wrap in MODES.items():
    vs = [tf.Variable(np.full([2, 2], r, np.float32)), tf.Variable(r, dtype=tf.int64),
          tf.Variable([r], dtype=tf.uint32)]
    def bcast_vars():
        hvd.broadcast_variables(vs, root_rank=n - 1)  # eagerly None, in a graph an op

    wrap(bcast_vars)()
    check(vs[0], np.full([2, 2], n - 1, np.float32), f"{mode} broadcast_variables float")
    check(vs[1], np.int64(n - 1), f"{mode} broadcast_variables scalar")
    check(vs[2], np.array([n - 1], np.uint32), f"{mode} broadcast_variables uint32")
    v = tf.Variable([float(r)] * 3)
    out = wrap(lambda: hvd.broadcast_(v, 0))()
    check(v, np.zeros(3, np.float32), f"{mode} broadcast_ (in place)")
    check(out, np.zeros(3, np.float32), f"{mode} broadcast_ result")
    def barrier():
        hvd.barrier()

    wrap(barrier)()

obj = hvd.broadcast_object({"rank": r, "f": lambda z: z + 1} if r == 1 else None, root_rank=1)
if obj["rank"] != 1 or obj["f"](1) != 2:
    fail(f"broadcast_object got {obj}")
if hvd.allgather_object(("r", r)) != [("r", s) for s in range(n)]:
    fail("allgather_object")
if np_of(hvd.rank_op()) != r or np_of(hvd.size_op()) != n:
    fail("rank_op/size_op")

# ---------------------------------------------------------------- errors

expect_raises(commlib.CollectiveMismatchError,
              lambda: hvd.allreduce(tf.ones([2 + r]), name="mismatch"), "eager shape mismatch",
              match="Mismatched shape")


@tf.function
def mismatch():
    return hvd.allreduce(tf.ones([2 + r]), op=hvd.Sum)


e = expect_raises(tf.errors.FailedPreconditionError, mismatch, "graph shape mismatch")
if not isinstance(e, commlib.CollectiveMismatchError) or "Mismatched shape" not in str(e):
    fail(f"graph mismatch error is not commlib's or does not name the cause: {e!r}")
check(hvd.allreduce(tf.ones([2]), op=hvd.Sum), np.full(2, n, np.float32), "after mismatches")

for dtype, want in ((tf.int16, np.int16), (tf.uint16, np.uint16), (tf.uint32, np.uint32),
                    (tf.uint64, np.uint64)):  # Horovod's integer dtypes, reduced by the core
    check(hvd.allreduce(tf.constant([r + 1, 60000], dtype), op=hvd.Sum),
          np.array([n * (n + 1) // 2, 60000 * n], np.int64).astype(want),
          f"allreduce Sum {dtype.name} (wraps as numpy)")
    check(tf.function(lambda: hvd.allreduce(tf.constant([r + 1, 7], dtype), op=hvd.Max))(),
          np.array([n, 7], want), f"allreduce Max {dtype.name} in tf.function")
for dtype in (tf.complex64, tf.string):
    z = tf.constant(["a"]) if dtype == tf.string else tf.zeros([2], dtype)
    expect_raises(TypeError, lambda: hvd.allreduce(z), f"allreduce {dtype.name}",
                  match="unsupported dtype")
    expect_raises(TypeError, lambda: tf.function(lambda: hvd.allreduce(z))(),
                  f"allreduce {dtype.name} in tf.function", match="unsupported dtype")
expect_raises(TypeError, lambda: hvd.broadcast(tf.constant(["a"]), 0), "broadcast string")
for bad in ("2", None):  # scale factors are numbers (checked when traced, before anything is sent)
    expect_raises(TypeError, lambda: tf.function(lambda: hvd.allreduce(tf.ones(2), prescale_factor=bad))(),
                  f"allreduce prescale {bad!r} in tf.function", match="prescale_factor must be a real number")
    expect_raises(TypeError, lambda: hvd.grouped_allreduce([tf.ones(2)], postscale_factor=bad),
                  f"grouped_allreduce postscale {bad!r}", match="postscale_factor must be a real number")
    expect_raises(TypeError, lambda: hvd.reducescatter(tf.ones(2 * n), prescale_factor=bad),
                  f"reducescatter prescale {bad!r}", match="prescale_factor must be a real number")
expect_raises(TypeError, lambda: hvd.allreduce(tf.ones(2, tf.int32), op=hvd.Adasum), "Adasum int32",
              match="Adasum")
expect_raises(TypeError, lambda: hvd.allreduce(tf.ones(2), process_set=object()),
              "process set of the wrong type")
expect_raises(ValueError, lambda: hvd.allreduce(tf.ones(2), process_set=hvd.ProcessSet([0])),
              "unregistered process set", match="not registered")
expect_raises(ValueError, lambda: hvd.broadcast(tf.ones(2), n), "root outside the job")
# a grouped collective takes a list: one tensor (it would be taken as the list
# of its rows) or array is refused before anything is sent; None and [] come back
for fn in (hvd.grouped_allreduce, hvd.grouped_allgather, hvd.grouped_reducescatter):
    for one in (tf.ones([n, 2]), tf.constant(1.0), np.ones(n, np.float32)):
        expect_raises(TypeError, lambda: fn(one), f"{fn.__name__} of one {type(one).__name__}",
                      match="takes a list of tensors")
    expect_raises(TypeError, lambda: tf.function(lambda t: fn(t))(tf.ones([n])),
                  f"{fn.__name__} of one tensor in tf.function", match="takes a list of tensors")
# ragged and sparse tensors, a lone variable or plain tensors to broadcast_variables,
# a tape that is no tf.GradientTape: TypeError naming the problem, before anything is sent
for odd in (tf.ragged.constant([[1.0], [2.0, 3.0]]), tf.sparse.from_dense(tf.ones([n, 2]))):
    for fn in (hvd.allreduce, hvd.allgather, hvd.alltoall, hvd.reducescatter, lambda t: hvd.broadcast(t, 0)):
        expect_raises(TypeError, lambda: fn(odd), f"a {type(odd).__name__} to {fn.__name__}", match="dense")
lone = tf.Variable([1.0, 2.0])
expect_raises(TypeError, lambda: hvd.broadcast_variables(lone, 0), "broadcast_variables of one variable",
              match="list")
expect_raises(TypeError, lambda: hvd.broadcast_variables([lone, tf.ones(2)], 0),
              "broadcast_variables of a tensor", match="at index 1")
expect_raises(TypeError, lambda: hvd.DistributedGradientTape(object()), "a tape that is not one",
              match="tf.GradientTape")
# alltoall splits are counts: floats are refused, not truncated (as by the numpy API)
for bad in ([1.5] * n, np.full(n, 1.0), [True] * n):
    expect_raises(ValueError, lambda: hvd.alltoall(tf.ones([n]), splits=bad), f"alltoall splits {bad!r}",
                  match="sequence of integers")
expect_raises(ValueError, lambda: tf.function(lambda s: hvd.alltoall(tf.ones([n]), splits=s))(tf.ones([n])),
              "alltoall float splits in tf.function", match="sequence of integers")
for fn in (hvd.grouped_allreduce, hvd.grouped_allgather):
    if fn(None) is not None or fn([]) != []:
        fail(f"{fn.__name__}: None and [] must come back as given (Horovod's behaviour)")
check(hvd.grouped_allreduce((tf.ones(2), tf.ones(3)), op=hvd.Sum)[1], np.full(3, float(n), np.float32),
      "grouped_allreduce of a tuple")
check(hvd.grouped_allreduce((t for t in (tf.ones(2), tf.ones(3))), op=hvd.Sum)[1],
      np.full(3, float(n), np.float32), "grouped_allreduce of a generator (read once)")
expect_raises(RuntimeError, lambda: tf.function(lambda: hvd.allreduce(tf.ones(2)),
                                                jit_compile=True)(), "XLA refused",
              match="XLA")
for what, fn in [("reducescatter", lambda: hvd.reducescatter(tf.constant(1.0))),
                 ("grouped_reducescatter",
                  lambda: hvd.grouped_reducescatter([tf.ones([2 * n]), tf.constant(1.0)])),
                 ("grouped_allgather", lambda: hvd.grouped_allgather([tf.ones([2]), tf.constant(1.0)]))]:
    e = expect_raises(ValueError, fn, f"{what} of a 0-d tensor", match="0-d")
    if not isinstance(e, hvd.HorovodInternalError):
        fail(f"{what} of a 0-d tensor: {type(e).__name__} is not a HorovodInternalError")
check(hvd.allreduce(tf.ones([2]), op=hvd.Sum, process_set=hvd.global_process_set),
      np.full(2, n, np.float32), "global process set accepted")
done()

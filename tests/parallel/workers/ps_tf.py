"""commlib.tensorflow with process sets, every rank checking against numpy:
collectives on the set each rank belongs to (even ranks: a static set from
init(process_sets=); odd ranks: a set added afterwards; both at once), eagerly
and inside tf.function (including graphs in which only a set's members trace
extra ops before a global one), gradients over the set, size/included ops,
refusals for non-members (also at trace time), and DistributedGradientTape /
Keras DistributedOptimizer with process_set= built on every rank: members end
where training on the members' combined batch ends, other ranks train
locally."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
tf.get_logger().setLevel("ERROR")

import commlib.tensorflow as hvd  # noqa: E402
import commlib.tensorflow.keras as hvd_keras  # noqa: E402
from _common import check_equal, done, expect_raises, fail, init_even_odd  # noqa: E402

even, odd, mine, other = init_even_odd(hvd)
r, n = hvd.rank(), hvd.size()
ranks = mine.ranks
m, pos = len(ranks), ranks.index(r)
root = ranks[-1]


def check(got, want, what, rtol=0.0):
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    check_equal(got, np.asarray(want), what, rtol=rtol, atol=rtol)


def data(k, shape=(2, 3)):
    return (np.arange(int(np.prod(shape))).reshape(shape) * (k + 1) + k).astype(np.float32)


def weights(k, shape):
    return (np.arange(int(np.prod(shape))).reshape(shape) % 7 + 10 * k + 1).astype(np.float32)


def rows_of(dim0, q):
    return dim0 // m + (1 if q < dim0 % m else 0)


X = {k: data(k) for k in ranks}
total = sum(X[k] for k in ranks)
G = {k: np.arange(2 * (k + 1), dtype=np.float32).reshape(k + 1, 2) + 100 * k for k in ranks}
gathered = np.concatenate([G[k] for k in ranks])
DIM0 = 2 * m + 1
R = {k: data(k, (DIM0, 2)) for k in ranks}
lo = sum(rows_of(DIM0, q) for q in range(pos))
part = slice(lo, lo + rows_of(DIM0, pos))
rtotal = sum(R[k] for k in ranks)


def splits_of(p):
    return [(p + j) % 2 + 1 for j in range(m)]


def a2a(k):
    rows = sum(splits_of(ranks.index(k)))
    return (np.arange(rows, dtype=np.float32) + 1000 * k).reshape(rows, 1)


def segment(k, j):
    s = splits_of(ranks.index(k))
    return a2a(k)[sum(s[:j]):sum(s[:j + 1])]


a2a_want = np.concatenate([segment(k, pos) for k in ranks])
a2a_recv = np.array([splits_of(ranks.index(k))[pos] for k in ranks], np.int32)

# ------------------------------------------------------------ eager collectives
tag = f"eager {ranks}"
check(hvd.allreduce(X[r], process_set=mine), total / m, f"{tag} allreduce Average", 1e-6)
check(hvd.allreduce(X[r], op=hvd.Sum, process_set=mine), total, f"{tag} allreduce Sum")
outs = hvd.grouped_allreduce([tf.constant(X[r]), tf.constant(X[r][0])], op=hvd.Sum,
                             process_set=mine)
check(outs[1], total[0], f"{tag} grouped_allreduce")
check(hvd.allgather(G[r], process_set=mine), gathered, f"{tag} allgather")
check(hvd.broadcast(X[r], root, process_set=mine), X[root], f"{tag} broadcast")
out, recv = hvd.alltoall(a2a(r), splits=splits_of(pos), process_set=mine)
check(out, a2a_want, f"{tag} alltoall")
check(recv, a2a_recv, f"{tag} alltoall received splits")
check(hvd.alltoall(np.arange(2.0 * m, dtype=np.float32) + 10 * r, process_set=mine),
      np.concatenate([np.arange(2.0 * m, dtype=np.float32)[2 * pos:2 * pos + 2] + 10 * k
                      for k in ranks]), f"{tag} alltoall even")
check(hvd.reducescatter(R[r], op=hvd.Sum, process_set=mine), rtotal[part],
      f"{tag} reducescatter")
sl = tf.IndexedSlices(tf.constant([[float(r + 1)]]), tf.constant([r % 3]), tf.constant([3, 1]))
check(tf.convert_to_tensor(hvd.allreduce(sl, process_set=mine)),
      np.array([[sum((k + 1) / m for k in ranks if k % 3 == i)] for i in range(3)], np.float32),
      f"{tag} IndexedSlices Average", 1e-6)
hvd.barrier(process_set=mine)
v = tf.Variable(X[r])
hvd.broadcast_variables([v], root_rank=root, process_set=mine)
check(v, X[root], f"{tag} broadcast_variables")
if hvd.broadcast_object(("from", r), root_rank=root, process_set=mine) != ("from", root):
    fail(f"{tag} broadcast_object")
if hvd.allgather_object(r, process_set=mine) != ranks:
    fail(f"{tag} allgather_object")
check(hvd.size_op(mine.process_set_id), np.int32(m), f"{tag} size_op")
check(hvd.process_set_included_op(mine.process_set_id), np.int32(1),
      f"{tag} process_set_included_op")
check(hvd.process_set_included_op(other.process_set_id), np.int32(0),
      "process_set_included_op (other)")

# ------------------------------------------------------------ tf.function
@tf.function
def collectives(x, g, rs, a, s):
    return (hvd.allreduce(x, op=hvd.Sum, process_set=mine),
            hvd.allgather(g, process_set=mine),
            hvd.reducescatter(rs, op=hvd.Sum, process_set=mine),
            hvd.allreduce(x, op=hvd.Sum),  # a global op in the same graph
            hvd.broadcast(x, root, process_set=mine),
            hvd.alltoall(a, splits=s, process_set=mine)[0])


for attempt in range(2):
    tag = f"tf.function {ranks} run {attempt}"
    res = collectives(tf.constant(X[r]), tf.constant(G[r]), tf.constant(R[r]),
                      tf.constant(a2a(r)), tf.constant(splits_of(pos)))
    check(res[0], total, f"{tag} allreduce")
    check(res[1], gathered, f"{tag} allgather")
    check(res[2], rtotal[part], f"{tag} reducescatter")
    check(res[3], sum(data(k) for k in range(n)), f"{tag} global allreduce")
    check(res[4], X[root], f"{tag} broadcast")
    check(res[5], a2a_want, f"{tag} alltoall")
rs_static = collectives.get_concrete_function(
    tf.TensorSpec([2, 3], tf.float32), tf.TensorSpec([None, 2], tf.float32),
    tf.TensorSpec([DIM0, 2], tf.float32), tf.TensorSpec([None, 1], tf.float32),
    tf.TensorSpec([m], tf.int32)).outputs[2].shape
if rs_static.as_list() != [rows_of(DIM0, pos), 2]:
    fail(f"reducescatter static shape on the set: {rs_static}")


@tf.function
def members_first(x):
    # only the even set's members trace these ops: the global op after them
    # must still get the same name on every rank
    if even.included():
        for _ in range(2):
            x = hvd.allreduce(x, op=hvd.Sum, process_set=even)
        hvd.barrier(process_set=even)
    return hvd.allreduce(x, op=hvd.Sum)


ones = np.ones(2, np.float32)
per_rank = {k: ones * (even.size() ** 2 if k in even.ranks else 1) for k in range(n)}
for attempt in range(2):
    check(members_first(tf.constant(ones)), sum(per_rank.values()),
          f"set ops only on members before a global op, run {attempt}")

# ------------------------------------------------------------ gradients over the set
def grads_of(fn, x):
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = fn(x)
    return tape.gradient(loss, x)


for mode in ("eager", "graph"):
    wrap = tf.function if mode == "graph" else (lambda f: f)
    tag = f"{mode} gradient {ranks}"
    g = wrap(lambda x: grads_of(lambda t: tf.reduce_sum(
        hvd.allreduce(t, process_set=mine) * weights(r, (2, 3))), x))(X[r])
    check(g, sum(weights(k, (2, 3)) for k in ranks) / m, f"{tag} allreduce", 1e-6)
    rows = len(gathered)
    g = wrap(lambda x: grads_of(lambda t: tf.reduce_sum(
        hvd.allgather(t, process_set=mine) * weights(r, (rows, 2))), x))(G[r])
    off = sum(k + 1 for k in ranks[:pos])
    check(g, sum(weights(k, (rows, 2)) for k in ranks)[off:off + r + 1],
          f"{tag} allgather (summed, as horovod.tensorflow)")
    g = wrap(lambda x: grads_of(lambda t: tf.reduce_sum(
        hvd.reducescatter(t, op=hvd.Average, process_set=mine)
        * weights(r, (rows_of(DIM0, pos), 2))), x))(R[r])
    check(g, np.concatenate([weights(k, (rows_of(DIM0, ranks.index(k)), 2)) for k in ranks]),
          f"{tag} reducescatter Average (Horovod's: no 1/size)", 1e-6)

# ------------------------------------------------------------ refusals
x1 = tf.ones([3])
for what, fn in [("allreduce", lambda: hvd.allreduce(x1, process_set=other)),
                 ("allgather", lambda: hvd.allgather(x1, process_set=other)),
                 ("broadcast", lambda: hvd.broadcast(x1, other.ranks[0], process_set=other)),
                 ("reducescatter", lambda: hvd.reducescatter(x1, process_set=other)),
                 ("barrier", lambda: hvd.barrier(process_set=other)),
                 ("broadcast_variables", lambda: hvd.broadcast_variables(
                     [tf.Variable(x1)], other.ranks[0], process_set=other)),
                 ("allreduce in tf.function (at trace time)",
                  lambda: tf.function(lambda t: hvd.allreduce(t, process_set=other))(x1))]:
    expect_raises(ValueError, fn, f"non-member {what}", match="not a member")
expect_raises(ValueError, lambda: hvd.broadcast(x1, other.ranks[0], process_set=mine),
              "root outside the set", match="not a member")
expect_raises(TypeError, lambda: hvd.DistributedGradientTape(tf.GradientTape(), process_set=1),
              "DistributedGradientTape with an int as set")

# ------------------------------------------------------------ training on a set
B, D_IN = 4, 5


def batch_of(k, step):
    g = np.random.default_rng(100 * step + k)
    return g.normal(size=(B, D_IN)).astype(np.float32), g.normal(size=(B, 1)).astype(np.float32)


def init_params():
    g = np.random.default_rng(0)
    return [g.normal(0, 0.3, (D_IN, 4)).astype(np.float32), np.zeros(4, np.float32),
            g.normal(0, 0.3, (4, 1)).astype(np.float32)]


def loss_fn(ps, x, y):
    return tf.reduce_mean(tf.square(tf.tanh(x @ ps[0] + ps[1]) @ ps[2] - y))


def combined(group, step):
    xs, ys = zip(*[batch_of(k, step) for k in group])
    return np.concatenate(xs), np.concatenate(ys)


def rel_err(got, want):
    return max(float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-6))
               for a, b in zip(got, want))


in_even = even.included()
group = even.ranks if in_even else [r]
for mode in ("eager", "graph"):
    ps = [tf.Variable(a) for a in init_params()]
    ref = [tf.Variable(a) for a in init_params()]

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(ps, x, y)
        tape = hvd.DistributedGradientTape(tape, process_set=even)
        for p, g in zip(ps, tape.gradient(loss, ps)):
            p.assign_sub(0.1 * g)

    if mode == "graph":
        step = tf.function(step)
    for t in range(3):
        step(*map(tf.constant, batch_of(r, t)))
        if not in_even:  # meanwhile, collectives on the rank's own set
            check(hvd.allreduce(ones, op=hvd.Sum, process_set=odd), ones * odd.size(),
                  "side work on the other set")
        gx, gy = combined(group, t)
        with tf.GradientTape() as tape:
            loss = loss_fn(ref, gx, gy)
        for p, g in zip(ref, tape.gradient(loss, ref)):
            p.assign_sub(0.1 * g)
    err = rel_err([p.numpy() for p in ps], [p.numpy() for p in ref])
    if err > 1e-5:
        fail(f"{mode} DistributedGradientTape(process_set={even.ranks}) on rank {r}: "
             f"relative error {err}")
    print(f"rank {r}: {mode} tape on a set relative error {err:.2e}", flush=True)


def keras_model():
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.layers.Input((D_IN,)), keras.layers.Dense(3, activation="tanh"),
                             keras.layers.Dense(1)])


model, ref_model = keras_model(), keras_model()
opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5), process_set=even)
ref_opt = keras.optimizers.SGD(0.1, momentum=0.5)
mse = keras.losses.MeanSquaredError()


@tf.function
def keras_step(x, y):
    with tf.GradientTape() as tape:
        loss = mse(y, model(x, training=True))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                            model.trainable_variables))


for t in range(3):
    keras_step(*map(tf.constant, batch_of(r, t)))
    gx, gy = combined(group, t)
    with tf.GradientTape() as tape:
        loss = mse(gy, ref_model(gx, training=True))
    ref_opt.apply_gradients(zip(tape.gradient(loss, ref_model.trainable_variables),
                                ref_model.trainable_variables))
err = rel_err(model.get_weights(), ref_model.get_weights())
if err > 1e-5:
    fail(f"Keras DistributedOptimizer(process_set={even.ranks}) on rank {r}: relative error {err}")
print(f"rank {r}: keras optimizer on a set relative error {err:.2e}", flush=True)
if not hvd.remove_process_set(odd):
    fail("remove_process_set(odd)")
done()

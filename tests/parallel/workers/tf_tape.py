"""DistributedGradientTape: N ranks x batch B averaged gradients end where
one process trained on the N*B batch ends (eager and tf.function; plain
variables with SGD, a Keras model with Adam; sparse embedding gradients with
and without sparse_as_dense), bitwise equal across ranks; groups,
predivide, Sum, fp16 compression, local sources; SyncBatchNormalization
(N x B = BatchNormalization on N*B); the TF1 optimizer wrapper with
BroadcastGlobalVariablesHook in a v1 session."""
import keras
import numpy as np
import tensorflow as tf
from tf_common import check, done, fail, hvd, max_rel_err, same_on_all_ranks

r, n = hvd.rank(), hvd.size()
B, STEPS, D_IN, D_H = 8, 20, 10, 16
rng = np.random.default_rng(1234)  # the same global data set on every rank
X = rng.normal(size=(STEPS * n * B, D_IN)).astype(np.float32)
Y = (np.tanh(X @ rng.normal(size=(D_IN, 1))) + 0.1 * rng.normal(size=(STEPS * n * B, 1))
     ).astype(np.float32)


def shard(t):
    """Rank r's rows of global step t, and the whole global batch."""
    lo = t * n * B
    return (X[lo + r * B:lo + (r + 1) * B], Y[lo + r * B:lo + (r + 1) * B],
            X[lo:lo + n * B], Y[lo:lo + n * B])


def init_params(seed):
    g = np.random.default_rng(seed)
    return [g.normal(0, 0.3, (D_IN, D_H)).astype(np.float32), np.zeros(D_H, np.float32),
            g.normal(0, 0.3, (D_H, 1)).astype(np.float32), np.zeros(1, np.float32)]


def loss_fn(ps, x, y):
    h = tf.nn.relu(x @ ps[0] + ps[1])
    return tf.reduce_mean(tf.square(h @ ps[2] + ps[3] - y))


def train_plain_variables(mode):
    """Horovod's TF2 pattern: each rank starts from different random
    weights, rank 0's are broadcast after the first step."""
    ps = [tf.Variable(a) for a in init_params(seed=r)]
    ref = [tf.Variable(a) for a in init_params(seed=0)]
    lr = 0.1

    def step(x, y, first):
        with tf.GradientTape() as tape:
            loss = loss_fn(ps, x, y)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, ps)
        for p, g in zip(ps, grads):
            p.assign_sub(lr * g)
        if first:
            hvd.broadcast_variables(ps, root_rank=0)
        return loss

    def ref_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(ref, x, y)
        for p, g in zip(ref, tape.gradient(loss, ref)):
            p.assign_sub(lr * g)

    if mode == "graph":
        step = tf.function(step)
    for t in range(STEPS):
        x, y, gx, gy = shard(t)
        step(tf.constant(x), tf.constant(y), t == 0)
        if t == 0:  # the reference starts from rank 0's weights after its first step
            for p, q in zip(ref, ps):
                p.assign(q)
        else:
            ref_step(gx, gy)
    got = [p.numpy() for p in ps]
    same_on_all_ranks(got, f"{mode} tape weights")
    return max_rel_err(got, [p.numpy() for p in ref])


def keras_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.layers.Input((D_IN,)),
                             keras.layers.Dense(D_H, activation="tanh"),
                             keras.layers.Dense(1)])


def train_keras_model_adam(mode):
    model, ref = keras_model(seed=100 + r), keras_model(seed=100)
    opt, ref_opt = keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.01)
    mse = keras.losses.MeanSquaredError()

    def step(x, y, first):
        with tf.GradientTape() as tape:
            loss = mse(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    if mode == "graph":
        step = tf.function(step)
    # rank 0's initial weights for the reference (broadcast before training
    # starts here, so that the first step is equivalent too)
    hvd.broadcast_variables(model.variables, root_rank=0)
    ref.set_weights(model.get_weights())
    for t in range(STEPS):
        x, y, gx, gy = shard(t)
        step(tf.constant(x), tf.constant(y), t == 0)
        with tf.GradientTape() as tape:
            loss = mse(gy, ref(gx, training=True))
        ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables),
                                    ref.trainable_variables))
    same_on_all_ranks(model.get_weights(), f"{mode} keras weights")
    return max_rel_err(model.get_weights(), ref.get_weights())


def train_embedding(sparse_as_dense, mode):
    """An embedding's gradient is IndexedSlices: allgathered, or densified."""
    vocab, dim = 12, 3
    g = np.random.default_rng(7)
    ids = g.integers(0, vocab, size=(STEPS * n * B, 4))
    targets = g.normal(size=(STEPS * n * B, 1)).astype(np.float32)
    table0 = g.normal(size=(vocab, dim)).astype(np.float32)
    emb, ref = tf.Variable(table0), tf.Variable(table0)
    w = tf.constant(g.normal(size=(dim, 1)).astype(np.float32))

    def loss_of(table, i, y):
        return tf.reduce_mean(tf.square(tf.reduce_sum(tf.gather(table, i), 1) @ w - y))

    def step(i, y):
        with tf.GradientTape() as tape:
            loss = loss_of(emb, i, y)
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        (grad,) = tape.gradient(loss, [emb])
        if isinstance(grad, tf.IndexedSlices) == sparse_as_dense:
            raise AssertionError(f"unexpected gradient type {type(grad).__name__}")
        emb.assign_sub(0.1 * tf.convert_to_tensor(grad))

    if mode == "graph":
        step = tf.function(step)
    for t in range(5):
        lo = t * n * B
        step(tf.constant(ids[lo + r * B:lo + (r + 1) * B]),
             tf.constant(targets[lo + r * B:lo + (r + 1) * B]))
        with tf.GradientTape() as tape:
            loss = loss_of(ref, ids[lo:lo + n * B], targets[lo:lo + n * B])
        ref.assign_sub(0.1 * tf.convert_to_tensor(tape.gradient(loss, ref)))
    same_on_all_ranks([emb.numpy()], "embedding")
    return max_rel_err([emb.numpy()], [ref.numpy()])


def train_sync_batch_norm(mode):
    """SyncBatchNormalization on N ranks x B = BatchNormalization on N*B."""
    def bn_model(cls):
        keras.utils.set_random_seed(3)
        return keras.Sequential([keras.layers.Input((D_IN,)), keras.layers.Dense(D_H), cls(),
                                 keras.layers.Activation("tanh"), keras.layers.Dense(1)])

    model, ref = bn_model(hvd.SyncBatchNormalization), bn_model(keras.layers.BatchNormalization)
    opt, ref_opt = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)
    mse = keras.losses.MeanSquaredError()

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = mse(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))

    if mode == "graph":
        step = tf.function(step)
    for t in range(5):
        x, y, gx, gy = shard(t)
        step(tf.constant(x), tf.constant(y))
        with tf.GradientTape() as tape:
            loss = mse(gy, ref(gx, training=True))
        ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables),
                                    ref.trainable_variables))
    same_on_all_ranks(model.get_weights(), "SyncBatchNormalization weights")
    return max_rel_err(model.get_weights(), ref.get_weights())  # moving statistics included


errors = {}
for mode in ("eager", "graph"):
    errors[f"SyncBatchNormalization {mode}"] = train_sync_batch_norm(mode)
    errors[f"variables/SGD {mode}"] = train_plain_variables(mode)
    errors[f"keras/Adam {mode}"] = train_keras_model_adam(mode)
    for sad in (False, True):
        errors[f"embedding sparse_as_dense={sad} {mode}"] = train_embedding(sad, mode)
worst = max(errors.values())
print(f"rank {r}: tape equivalence max relative error {worst:.3g} "
      + ", ".join(f"{k}: {v:.2g}" for k, v in errors.items()), flush=True)
if worst > 1e-5:
    fail(f"DistributedGradientTape differs from single-process training: {errors}")

# ---------------------------------------------------------------- options

ps = [tf.Variable(a) for a in init_params(seed=0)]
x, y, _, _ = shard(r)


def grads_with(**kw):
    with tf.GradientTape() as tape:
        loss = loss_fn(ps, tf.constant(x), tf.constant(y))
    tape = hvd.DistributedGradientTape(tape, **kw)
    return [g.numpy() for g in tape.gradient(loss, ps)]


def local_grads():
    with tf.GradientTape() as tape:
        loss = loss_fn(ps, tf.constant(x), tf.constant(y))
    return [g.numpy() for g in tape.gradient(loss, ps)]


base = grads_with()
every = hvd.allgather_object(local_grads())
want = [np.mean([e[i] for e in every], 0) for i in range(len(ps))]
if max_rel_err(base, want) > 1e-6:
    fail("averaged gradients differ from the mean of every rank's gradients")
for kw in ({"num_groups": 2}, {"groups": 3}, {"groups": [[ps[0], ps[3]], [ps[1]]]},
           {"gradient_predivide_factor": 2.0}):
    if max_rel_err(grads_with(**kw), base) > 1e-6:
        fail(f"gradients with {kw} differ")
if max_rel_err(grads_with(op=hvd.Sum), [g * n for g in base]) > 1e-6:
    fail("op=Sum")
if max_rel_err(grads_with(compression=hvd.Compression.fp16), base) > 2e-3:
    fail("fp16 compression")
got = grads_with(compression=hvd.Compression.fp16)
if any(g.dtype != np.float32 for g in got):
    fail("fp16 compression changed the gradient dtype")

# a local source keeps its own gradient, divided by size (scale_local_gradients)
with tf.GradientTape() as tape:
    loss = loss_fn(ps, tf.constant(x), tf.constant(y))
tape = hvd.DistributedGradientTape(tape)
tape.register_local_source(ps[3])
got = tape.gradient(loss, ps)
check(got[3], local_grads()[3] / n, "local source gradient", rtol=1e-6, atol=1e-7)
check(got[0], base[0], "shared gradient next to a local source", rtol=1e-6, atol=1e-7)

# nested sources, None gradients (unconnected), persistent tape
extra = tf.Variable(1.0)
with tf.GradientTape(persistent=True) as tape:
    loss = loss_fn(ps, tf.constant(x), tf.constant(y))
tape = hvd.DistributedGradientTape(tape)
got = tape.gradient(loss, {"a": ps[:2], "b": (ps[2], ps[3]), "c": extra})
if got["c"] is not None or max_rel_err([got["a"][0], got["b"][1]], [base[0], base[3]]) > 1e-6:
    fail("nested sources / unconnected gradient")

# ---------------------------------------------------------------- TF1 optimizer, v1 session

with tf.Graph().as_default():
    w = tf.compat.v1.get_variable("w", initializer=tf.constant([float(r), 1.0]))
    loss = tf.reduce_sum(w * float(r + 1))  # gradient r+1, averaged (n+1)/2
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
    train = opt.minimize(loss)
    with tf.compat.v1.train.MonitoredTrainingSession(
            hooks=[hvd.BroadcastGlobalVariablesHook(0)]) as sess:
        sess.run(train)
        sess.run(train)
        got = sess.run(w)
    check(got, np.array([0.0, 1.0], np.float32) - 2 * 0.5 * (n + 1) / 2, "TF1 optimizer")

# dispatch
opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
if not isinstance(opt, keras.optimizers.SGD) or not hasattr(opt, "register_local_var"):
    fail("commlib.tensorflow.DistributedOptimizer did not wrap a Keras optimizer")
done()

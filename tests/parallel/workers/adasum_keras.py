"""op=Adasum in commlib.tensorflow: allreduce / grouped_allreduce eagerly and
in tf.function against adasum_reference, integer dtypes refused at trace
time; Keras DistributedOptimizer(op=Adasum) (SGD with momentum), trained in a
tf.function step on each rank's own batch: after every step the replicas are
bitwise identical and match a simulation that combines every rank's
gradients with adasum_reference and applies them with a plain optimizer (as
Horovod's Keras optimizer, which reduces the gradients with Adasum)."""
import keras
import numpy as np
import tensorflow as tf
from tf_common import check, done, expect_raises, fail, max_rel_err, same_on_all_ranks

import commlib.tensorflow.keras as hvd_keras
from adasum_reference import adasum
from tf_common import hvd

r, n = hvd.rank(), hvd.size()
B, STEPS, D_IN = 8, 5, 6


def rank_values(q, shape, seed):
    rng = np.random.default_rng(100 * seed + q)
    return rng.standard_normal(shape) + 0.3 * q


# ---- collectives, eagerly and traced
xs = [rank_values(q, (4, 3), 1) for q in range(n)]
check(hvd.allreduce(tf.constant(xs[r]), op=hvd.Adasum, name="eager"), adasum(xs),
      "allreduce Adasum eager", rtol=1e-6, atol=1e-6)
f32 = [x.astype(np.float32) for x in xs]
traced = tf.function(lambda t: hvd.allreduce(t, op=hvd.Adasum))
check(traced(tf.constant(f32[r])), adasum(f32).astype(np.float32), "allreduce Adasum traced",
      rtol=1e-5, atol=1e-5)
groups = [[rank_values(q, s, 10 + i) * 10.0 ** i for q in range(n)]
          for i, s in enumerate([(3,), (40,), (2, 2)])]
outs = hvd.grouped_allreduce([tf.constant(g[r]) for g in groups], op=hvd.Adasum)
for i, (o, g) in enumerate(zip(outs, groups)):
    want = adasum(g)
    check(o, want, f"grouped Adasum tensor {i}", rtol=1e-6, atol=1e-6 * np.abs(want).max())
expect_raises(TypeError, lambda: hvd.allreduce(tf.ones(3, tf.int32), op=hvd.Adasum),
              "Adasum of int32", match="Adasum")
expect_raises(TypeError, lambda: tf.function(lambda: hvd.allreduce(tf.ones(3, tf.int64),
                                                                   op=hvd.Adasum))(),
              "Adasum of int64 in tf.function", match="Adasum")

# ---- Keras DistributedOptimizer(op=Adasum) against a simulation
rng = np.random.default_rng(7)
X = rng.normal(size=(STEPS, n, B, D_IN)).astype(np.float32)
Y = np.sin(X[..., :1]).astype(np.float32)


def make_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.layers.Input((D_IN,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1)])


def loss_of(model, x, y):
    return tf.reduce_mean(tf.square(model(x) - y))


model, ref = make_model(), make_model()
opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), op=hvd.Adasum)
ref_opt = keras.optimizers.SGD(0.05, momentum=0.9)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_of(model, x, y)
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)


worst = 0.0
for step in range(STEPS):
    train_step(tf.constant(X[step, r]), tf.constant(Y[step, r]))
    per_rank = []
    for q in range(n):
        with tf.GradientTape() as tape:
            loss = loss_of(ref, X[step, q], Y[step, q])
        per_rank.append([g.numpy() for g in tape.gradient(loss, ref.trainable_variables)])
    combined = [tf.constant(adasum([g[i] for g in per_rank]).astype(np.float32))
                for i in range(len(ref.trainable_variables))]
    ref_opt.apply(combined, ref.trainable_variables)
    same_on_all_ranks(model.get_weights(), f"Adasum Keras weights after step {step}")
    worst = max(worst, max_rel_err(model.get_weights(), ref.get_weights()))
if worst > 1e-5:
    fail(f"Keras Adasum left the simulation (max relative error {worst:.3g})")
print(f"rank {r}: Keras Adasum max relative error {worst:.3g}", flush=True)
expect_raises(ValueError, lambda: hvd_keras.DistributedOptimizer(
    keras.optimizers.SGD(0.1), op=hvd.Adasum, staleness=1), "Adasum staleness")
done()

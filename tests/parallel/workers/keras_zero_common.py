"""Shared by keras_zero.py and keras_zero_checkpoint.py: a small Keras model
(two trainable Dense layers, odd sizes so that 3 ranks get uneven shards,
and a frozen one whose variables are not trainable), the global batches of
each step (every rank takes its rows), and training loops."""
from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_common import hvd  # noqa: E402

G = 12  # global batch rows, divisible by 2 and 3
r, n = hvd.rank(), hvd.size()


def make_model(seed=0, dtype="float32", wide=33):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((6,), dtype=dtype)
    h = keras.layers.Dense(wide, activation="tanh", name="hidden", dtype=dtype)(inp)
    frozen = keras.layers.Dense(wide, name="frozen", dtype=dtype)
    frozen.trainable = False
    h = h + 0.1 * frozen(h)
    out = keras.layers.Dense(3, name="head", dtype=dtype)(h)
    return keras.Model(inp, out)


def batch(step, dtype="float32"):
    g = np.random.default_rng(500 + step)
    return g.standard_normal((G, 6)).astype(dtype), g.standard_normal((G, 3)).astype(dtype)


def local_rows(a):
    rows = G // n
    return a[r * rows:(r + 1) * rows]


def loss_fn(model, x, y):
    return tf.reduce_mean(tf.square(model(x, training=True) - y))


def train(model, opt, steps, start=0, local=True, mode="eager", lr_change=None, dtype="float32"):
    """``steps`` steps of a custom loop (mode "eager": opt.apply; "function":
    opt.apply_gradients inside tf.function) on each step's local rows (or the
    whole global batch when not ``local``); at step ``lr_change[0]`` the
    learning rate becomes ``lr_change[1]``."""
    variables = model.trainable_variables

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(model, x, y)
        grads = tape.gradient(loss, variables)
        if mode == "eager":
            opt.apply(grads, variables)
        else:
            opt.apply_gradients(zip(grads, variables))
        return loss

    fn = tf.function(step_fn) if mode == "function" else step_fn
    for step in range(start, start + steps):
        if lr_change is not None and step == lr_change[0]:
            opt.learning_rate = lr_change[1]
        x, y = batch(step, dtype)
        if local:
            x, y = local_rows(x), local_rows(y)
        fn(tf.constant(x), tf.constant(y))


def weights(model):
    return [v.numpy() for v in model.trainable_variables]

"""The task of the Keras asynchronous-exchange workers (tf_async.py,
tf_weight_prediction.py): every rank's batches (all ranks' data on every
rank, for the simulations), the model, its gradients and weights."""
import tf_common  # noqa: F401 - first: TensorFlow's settings, commlib initialised

import keras
import numpy as np
import tensorflow as tf

import commlib.keras as hvd

B, STEPS, D_IN = 8, 20, 6


def data(k):
    """Rank k's STEPS batches, from rank k's seed."""
    rng = np.random.default_rng(100 + k)
    x = rng.normal(size=(STEPS * B, D_IN)).astype(np.float32)
    y = (np.sin(x[:, :2]) + 0.1 * rng.normal(size=(len(x), 2))).astype(np.float32)
    return x, y


DATA = [data(k) for k in range(hvd.size())]


def make_model():
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.layers.Input((D_IN,)), keras.layers.Dense(12, activation="tanh"),
                             keras.layers.Dense(2)])


def make_bn_model():
    """With BatchNormalization (moving statistics: non-trainable variables);
    no bias before it (its gradient would be rounding noise)."""
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.layers.Input((D_IN,)), keras.layers.Dense(12, use_bias=False),
                             keras.layers.BatchNormalization(), keras.layers.Activation("tanh"),
                             keras.layers.Dense(2)])


def buffers(model):
    """The floating-point non-trainable variables (moving statistics)."""
    return [v for v in model.non_trainable_variables if "float" in str(v.dtype)]


def grads_of(model, k, t):
    x, y = DATA[k]
    xb, yb = x[t * B:(t + 1) * B], y[t * B:(t + 1) * B]
    with tf.GradientTape() as tape:  # (training: as in fit, batch norm updates its statistics)
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
    return tape.gradient(loss, model.trainable_variables)


def average(lists):
    return [tf.add_n(list(gs)) / len(gs) for gs in zip(*lists)]


def weights(model, with_buffers=True):
    """The trainable variables' values, then (``with_buffers``) the buffers'."""
    extra = buffers(model) if with_buffers else []
    return [v.numpy().copy() for v in list(model.trainable_variables) + extra]

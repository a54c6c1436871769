"""SyncBatchNormalization: Keras batch normalization whose training-time
statistics are those of the global batch (all ranks), as Horovod's
``hvd.SyncBatchNormalization``::

    model = keras.Sequential([..., commlib.tensorflow.SyncBatchNormalization(), ...])

Each training step sums, per normalized channel, every rank's element
count, sum and sum of squares (from its own mean and variance, in float64:
one small Sum allreduce per layer; differentiable, so gradients flow to
every rank's inputs). Masked inputs and inference use Keras' local
behaviour. There is no ``process_set``: statistics are over every rank of
the job.
"""
import keras
import tensorflow as tf

import commlib

from .mpi_ops import Sum, allreduce


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization with statistics over all ranks' batches."""

    def _moments(self, inputs, mask):
        if mask is not None or commlib.size() == 1:
            return super()._moments(inputs, mask)
        axes = list(self._reduction_axes)
        x = tf.convert_to_tensor(inputs)
        mean, var = tf.nn.moments(x, axes)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), tf.float64)
        mean, var = tf.cast(mean, tf.float64), tf.cast(var, tf.float64)
        # One allreduce: [sums, sums of squares about 0, count], in float64,
        # each rank's from its own mean and variance.
        total = allreduce(tf.concat([mean * count, (var + mean * mean) * count, count[None]], 0),
                          op=Sum)
        c = tf.shape(mean)[0]
        g_mean = total[:c] / total[-1]
        g_var = tf.maximum(total[c:2 * c] / total[-1] - g_mean * g_mean, 0.0)
        return tf.cast(g_mean, x.dtype), tf.cast(g_var, x.dtype)

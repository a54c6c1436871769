"""SyncBatchNormalization: Keras batch normalization whose training-time
statistics are those of the global batch (all ranks), as Horovod's
``hvd.SyncBatchNormalization``::

    model = keras.Sequential([..., commlib.tensorflow.SyncBatchNormalization(), ...])

Each training step reduces, per normalized channel, the element count and
sum, then the sum of squared deviations from the global mean (two small
Sum allreduces per layer; differentiable, so gradients flow to every rank's
inputs). Masked inputs and inference use Keras' local behaviour. There is no
``process_set``: statistics are over every rank of the job.
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
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
        total = allreduce(tf.concat([tf.reduce_sum(x, axes), count[None]], 0), op=Sum)
        mean = total[:-1] / total[-1]
        shape = [1 if i in [a % len(x.shape) for a in axes] else -1 for i in range(len(x.shape))]
        sq = allreduce(tf.reduce_sum(tf.square(x - tf.reshape(mean, shape)), axes), op=Sum)
        return mean, sq / total[-1]

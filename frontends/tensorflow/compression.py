"""Gradient compression for allreduce (Horovod's ``Compression.none`` and
``Compression.fp16``): compress before the collective, decompress after."""
import tensorflow as tf

from commlib.compression import CastCompressor, Compressor, NoneCompressor  # noqa: F401

from .powersgd import PowerSGD


class FP16Compressor(CastCompressor):
    """Sends floating-point tensors as float16 (reduced in float32 by the
    core) and casts the result back; other dtypes pass unchanged."""

    wire_dtype = tf.float16
    is_floating = staticmethod(lambda dtype: dtype.is_floating)
    cast = staticmethod(tf.cast)


class Compression:
    """Compression algorithms: ``Compression.none``, ``Compression.fp16``,
    ``Compression.powersgd(rank=2, ...)`` (low-rank with error feedback, for
    the Keras DistributedOptimizer and DistributedGradientTape only; see
    commlib.tensorflow.powersgd)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    powersgd = PowerSGD

"""Identity of TensorFlow/Keras variables, shared by the tape and PowerSGD."""
import tensorflow as tf


def var_key(v):
    """A stable identity for a variable (a Keras variable and the tf.Variable
    it wraps share one), for local sources and explicit groups."""
    inner = getattr(v, "_value", None)
    if isinstance(inner, tf.Variable):
        return id(inner)
    return id(v)

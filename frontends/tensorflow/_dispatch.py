"""Which framework an optimizer object belongs to, decided from its type's
modules only: importing this (and calling it) never imports TensorFlow or
Keras, so ``commlib.DistributedOptimizer`` can dispatch cheaply."""
from __future__ import annotations


def _modules(obj) -> list[str]:
    cls = obj if isinstance(obj, type) else type(obj)
    return [getattr(c, "__module__", "") or "" for c in cls.__mro__]


def is_keras_optimizer(obj) -> bool:
    """True for Keras optimizers: Keras 3 (``keras.optimizers.*``, any
    backend; commlib.tensorflow.keras refuses non-TensorFlow backends with a
    clear error), tf_keras / Keras 2 (``tf.keras.optimizers.legacy``) and
    ``LossScaleOptimizer``. Accepts an instance or a class."""
    for mod in _modules(obj):
        root = mod.split(".", 1)[0]
        if root in ("keras", "tf_keras") and "optimizer" in mod:
            return True
        if mod.startswith("tensorflow.python.keras.optimizer"):
            return True
    return False


def is_tf_legacy_optimizer(obj) -> bool:
    """True for TensorFlow 1 style ``tf.compat.v1.train.Optimizer`` instances."""
    cls = obj if isinstance(obj, type) else type(obj)
    return (any(mod.startswith("tensorflow.python.training.") for mod in _modules(cls))
            and any(c.__name__ == "Optimizer" for c in cls.__mro__))


def is_tf_optimizer(obj) -> bool:
    """True for the optimizers commlib.tensorflow.DistributedOptimizer wraps
    (Keras or TF1), with which commlib.tensorflow registers itself for
    ``commlib.DistributedOptimizer`` (see commlib.dispatch)."""
    return is_keras_optimizer(obj) or is_tf_legacy_optimizer(obj)

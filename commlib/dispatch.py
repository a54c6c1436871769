"""``commlib.DistributedOptimizer``: one entry point for every framework.

It hands a torch optimizer to ``commlib.torch.DistributedOptimizer`` and a
Keras (or TF1) optimizer to ``commlib.tensorflow.DistributedOptimizer``. An
object can only belong to a framework that is already imported, so the check
looks at ``sys.modules`` first and never imports a framework itself.
"""
from __future__ import annotations

import sys


def DistributedOptimizer(optimizer, *args, **kwargs):  # noqa: N802 (Horovod's name)
    """Wraps ``optimizer`` so that gradients are averaged across ranks; the
    remaining arguments are those of the framework's DistributedOptimizer."""
    if "torch" in sys.modules:
        from .torch import _dispatch as torch_dispatch

        if torch_dispatch.is_torch_optimizer(optimizer):
            return torch_dispatch.distributed_optimizer(optimizer, *args, **kwargs)
    if any(m in sys.modules for m in ("keras", "tf_keras", "tensorflow")):
        from .tensorflow import _dispatch as tf_dispatch

        if tf_dispatch.is_keras_optimizer(optimizer) or tf_dispatch.is_tf_legacy_optimizer(optimizer):
            return tf_dispatch.distributed_optimizer(optimizer, *args, **kwargs)
    raise TypeError(
        "commlib.DistributedOptimizer wraps a torch.optim.Optimizer or a Keras/TensorFlow "
        f"optimizer; got {type(optimizer).__module__}.{type(optimizer).__name__}"
    )

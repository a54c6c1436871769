"""Recognises torch optimizers for ``commlib.DistributedOptimizer``, with
which commlib.torch registers itself (see commlib.dispatch).

This module imports nothing but the standard library: it can be loaded by
file path, and ``is_torch_optimizer`` looks torch up in ``sys.modules``, so
it never imports torch (an object cannot be a torch optimizer unless torch is
already imported).
"""
import sys


def is_torch_optimizer(obj) -> bool:
    """True if ``obj`` is a torch.optim.Optimizer (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    optim = getattr(torch, "optim", None)
    base = getattr(optim, "Optimizer", None) if optim is not None else None
    return base is not None and isinstance(obj, base)

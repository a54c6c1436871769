"""Lets ``commlib.DistributedOptimizer(opt, ...)`` hand torch optimizers to
``commlib.torch.DistributedOptimizer`` without importing torch eagerly.

This module imports nothing but the standard library: it can be loaded by
file path, and ``is_torch_optimizer`` looks torch up in ``sys.modules``, so
a program that never imported torch never pays for it (and an object cannot
be a torch optimizer unless torch is already imported).

Wiring in commlib/__init__.py::

    def DistributedOptimizer(optimizer, *args, **kwargs):
        import sys
        if "torch" in sys.modules:
            from .torch._dispatch import is_torch_optimizer
            if is_torch_optimizer(optimizer):
                from .torch import DistributedOptimizer as torch_dist
                return torch_dist(optimizer, *args, **kwargs)
        raise TypeError(...)

(Importing ``commlib.torch._dispatch`` runs ``commlib/torch/__init__``, which
imports torch -- which is already loaded at that point.)
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


def distributed_optimizer(optimizer, *args, **kwargs):
    """commlib.torch.DistributedOptimizer(optimizer, *args, **kwargs), with
    commlib.torch imported only now."""
    from commlib.torch import DistributedOptimizer

    return DistributedOptimizer(optimizer, *args, **kwargs)

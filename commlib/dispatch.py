"""``commlib.DistributedOptimizer``: one entry point for every framework.

Framework frontends register themselves here when they are imported
(``register_optimizer``): commlib.torch for torch optimizers,
commlib.tensorflow for Keras and TF1 optimizers. commlib never imports a
frontend module statically; the arrow points from the frontends to commlib.

An optimizer can only come from a framework that is already imported, and
the root package of its type's modules (``torch.optim.sgd`` -> ``torch``)
names that framework. So that ``commlib.DistributedOptimizer(opt)`` works
without importing the frontend first (as before frontends registered
themselves), a framework's frontend is imported by name, once, when an
optimizer of that framework finds nothing registered yet
(``FRONTEND_OF_FRAMEWORK``; the frontend registers itself while it loads).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

# The frontend serving each framework, by the root package of the
# framework's modules. Frontends are named here as data only, and imported
# only for an optimizer of their framework.
FRONTEND_OF_FRAMEWORK = {
    "torch": "commlib.torch",
    "keras": "commlib.tensorflow",
    "tf_keras": "commlib.tensorflow",
    "tensorflow": "commlib.tensorflow",
}

# name -> (accepts(optimizer) -> bool, factory(optimizer, *args, **kwargs))
_registry: dict[str, tuple[Callable[[Any], bool], Callable[..., Any]]] = {}


def register_optimizer(name: str, accepts: Callable[[Any], bool],
                       factory: Callable[..., Any]) -> None:
    """Makes ``commlib.DistributedOptimizer(opt, *args, **kwargs)`` return
    ``factory(opt, *args, **kwargs)`` for every ``opt`` that ``accepts(opt)``
    is true for. ``name`` (the frontend's module name) identifies the entry:
    registering a name again replaces it."""
    _registry[name] = (accepts, factory)


def registered_frontends() -> list[str]:
    """The names of the registered frontends, in registration order."""
    return list(_registry)


def _factory_for(optimizer):
    for accepts, factory in _registry.values():
        if accepts(optimizer):
            return factory
    return None


def _frameworks_of(optimizer) -> list[str]:
    """The root packages of the modules of the optimizer's type and bases."""
    cls = optimizer if isinstance(optimizer, type) else type(optimizer)
    roots = []
    for c in getattr(cls, "__mro__", (cls,)):
        root = (getattr(c, "__module__", "") or "").split(".", 1)[0]
        if root not in roots:
            roots.append(root)
    return roots


def DistributedOptimizer(optimizer, *args, **kwargs):  # noqa: N802 (Horovod's name)
    """Wraps ``optimizer`` so that gradients are averaged across ranks; the
    remaining arguments are those of the framework's DistributedOptimizer
    (``commlib.torch.DistributedOptimizer``,
    ``commlib.tensorflow.DistributedOptimizer``)."""
    factory = _factory_for(optimizer)
    if factory is None:
        frontends = [FRONTEND_OF_FRAMEWORK[root] for root in _frameworks_of(optimizer)
                     if root in FRONTEND_OF_FRAMEWORK]
        for frontend in dict.fromkeys(frontends):
            if frontend not in _registry:
                importlib.import_module(frontend)  # registers itself
        factory = _factory_for(optimizer)
    if factory is None:
        kind = f"{type(optimizer).__module__}.{type(optimizer).__name__}"
        raise TypeError(
            "commlib.DistributedOptimizer wraps a torch.optim.Optimizer or a Keras/TensorFlow "
            f"optimizer; got {kind}, which no frontend accepts (registered: "
            f"{', '.join(_registry) or 'none'}). Import the frontend of its framework "
            "(import commlib.torch, import commlib.tensorflow) and use its DistributedOptimizer.")
    return factory(optimizer, *args, **kwargs)

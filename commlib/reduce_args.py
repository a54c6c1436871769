"""Horovod's arguments of reductions, as the framework frontends take them:
``op`` with the deprecated ``average`` (and its DeprecationWarning), and
``gradient_predivide_factor`` as prescale/postscale factors.

Nothing here imports a framework.
"""
from __future__ import annotations

import warnings

from . import ops
from .checks import scale_factor


def resolve_op(op=None, average=None, default=ops.Average) -> int:
    """``commlib.ops.resolve_op`` (unknown ops refused), plus
    Horovod's DeprecationWarning when the deprecated ``average`` is used."""
    resolved = ops.resolve_op(op, average, default)
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed",
                      DeprecationWarning, stacklevel=3)
    return resolved


def reducescatter_grad_scale(op: int, set_size: int, prescale_factor: float,
                             postscale_factor: float) -> float:
    """Horovod's factor on a reducescatter's output gradients before they
    are allgathered (its gradient, in every frontend): the process set's
    size for Sum, times both scale factors, for every op (Average gets no
    1/size, Min/Max/Product no derivative of their own)."""
    return (set_size if op == ops.Sum else 1) * prescale_factor * postscale_factor


def predivide_scales(op: int, gradient_predivide_factor: float) -> tuple[float, float]:
    """(prescale, postscale) for gradient averaging split around the sum, as
    Horovod's ``gradient_predivide_factor``: gradients are scaled by
    1/f before the sum and f/size after it (the core's Average divides by
    the size of the process set)."""
    f = scale_factor(gradient_predivide_factor, "gradient_predivide_factor")
    if f == 1.0:
        return 1.0, 1.0
    if op != ops.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if f <= 0:
        raise ValueError(f"gradient_predivide_factor must be positive, got {f}")
    return 1.0 / f, f

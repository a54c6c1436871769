"""One averaging of a model's gradients, started at once and waited for
later: the building block of delayed averaging (``staleness=1``) and of the
warm-up phase of LocalSGD.

The gradients of all parameters travel in one grouped in-place allreduce
(fused by the engine), together with one flag per parameter telling whether
the rank has a gradient for it: a parameter with a gradient on no rank gets
``None`` (the optimizer skips it, as single-process training would); ranks
without a gradient for a parameter that others have contribute zeros.

With ``take=True`` the gradient tensors themselves are handed to the
allreduce (no copy) and ``p.grad`` is set to None: the next backward
allocates fresh ones, or, after ``zero_grad(set_to_none=False)``, the
caller's tensors are whatever it puts back.
"""
from __future__ import annotations

import torch

from .. import mpi_ops as _ops
from ..collectives.compression import Compression


class PendingGradients:
    """Started averaging of the gradients of ``params``; ``wait()`` returns
    the averaged gradients (one tensor or None per parameter)."""

    def __init__(self, params, name, op=_ops.Average, scales=(1.0, 1.0),
                 compression=Compression.none, process_set=_ops.global_process_set,
                 communicate=True, take=False):
        self._params = list(params)
        self._compression = compression
        grads, flags = [], []
        for p in self._params:
            g = p.grad
            flags.append(0.0 if g is None else 1.0)
            if g is None:
                g = torch.zeros_like(p, memory_format=torch.contiguous_format)
            elif g.is_sparse:
                g = g.to_dense()
            elif not take or not g.is_contiguous():
                g = g.detach().clone(memory_format=torch.contiguous_format)
            grads.append(g.detach())
            if take:
                p.grad = None
        self._grads = grads
        self._flags = torch.tensor(flags, dtype=torch.float32)
        self._handle = None
        self._wire = None
        if communicate and self._params:
            self._wire = [compression.compress(g) for g in grads]
            bufs = [w if w.is_contiguous() else w.contiguous() for w, _ in self._wire]
            self._wire = [(b, c) for b, (_, c) in zip(bufs, self._wire)]
            pre, post = scales
            self._handle = _ops.grouped_allreduce_async_(
                bufs + [self._flags], name=name, op=op, prescale_factor=pre,
                postscale_factor=post, process_set=process_set)

    def wait(self) -> list:
        """The averaged gradients, in the order of ``params`` (None for a
        parameter without a gradient on every rank)."""
        if self._handle is not None:
            _ops.synchronize(self._handle)  # a failed one raises again at every wait()
            self._handle = None
            for i, (buf, cctx) in enumerate(self._wire):
                if buf is not self._grads[i]:
                    self._grads[i].copy_(self._compression.decompress(buf, cctx))
        return [g if f > 0 else None for g, f in zip(self._grads, self._flags.tolist())]

    @property
    def params(self) -> list:
        return self._params


def assign_grads(params, grads) -> None:
    """Sets ``p.grad`` of every parameter (None included)."""
    for p, g in zip(params, grads):
        p.grad = g


def closure_loss(closure):
    """``closure()`` (the loss) with gradients enabled, or None without one:
    what ``step(closure)`` of a wrapper that steps by itself returns."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()

"""``DistributedOptimizer(opt, op=Adasum)``: Horovod's delta optimizer.

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)

Each ``step()`` applies the wrapped optimizer to this rank's own gradients,
then combines the parameter updates across ranks with the Adasum allreduce
(one request per parameter, fused by the core, each parameter with its own
coefficients): ``p = p_old + adasum(p_new - p_old)``. Every rank starts the
step from the same parameters and gets the same Adasum result bit for bit, so
replicas stay identical; the optimizer's state (momentum, Adam moments) stays
each rank's own, as in Horovod. The learning rate is not scaled by the number
of ranks: Adasum of equal updates is that update, of orthogonal ones their sum.

Gradients are not exchanged, so there are no backward hooks and
``synchronize()`` does nothing (``skip_synchronize()`` raises, as in
Horovod). Parameters without a gradient on a rank contribute a zero update.
On ranks outside the process set it is the plain wrapped optimizer.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from .. import mpi_ops as _ops
from ..mpi_ops import Adasum
from .optimizer import DistributedOptimizerBase


class AdasumOptimizerBase(DistributedOptimizerBase):
    """Placed before DistributedOptimizerBase and the wrapped class."""

    def _register_hooks(self, params):
        pass  # (gradients stay local)

    def synchronize(self):
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError("skip_synchronize() is not supported with op=Adasum: gradients "
                             "are not exchanged, step() combines the parameter updates")
        yield  # pragma: no cover

    def step(self, closure=None):
        wrapped_step = super(DistributedOptimizerBase, self).step
        if not self._reduces:
            return wrapped_step(closure)
        params = [p for p in self._params if p.requires_grad]
        with torch.no_grad():
            starts = [p.detach().clone() for p in params]
        loss = wrapped_step(closure)
        with torch.no_grad():
            started = []
            for p, start in zip(params, starts):
                delta, cctx = self._compression.compress(p.detach() - start)
                delta = delta.contiguous()
                handle = _ops.allreduce_async_(delta, name=self._prefix + self._parameter_names[p],
                                               op=Adasum, process_set=self.process_set)
                started.append((p, start, delta, cctx, handle))
            first_error = None
            for p, start, delta, cctx, handle in started:
                try:
                    _ops.synchronize(handle)
                    p.copy_(start + self._compression.decompress(delta, cctx))
                except Exception as e:  # noqa: BLE001 - wait for all, raise the first
                    first_error = first_error or e
            if first_error is not None:
                raise first_error
        return loss


AdasumOptimizerBase.step.hooked = True  # (as DistributedOptimizerBase.step)


def check_arguments(**given: bool) -> None:
    """ValueError naming the options given (True) that DistributedOptimizer(op=Adasum)
    does not take."""
    bad = [k for k, v in given.items() if v]
    if bad:
        raise ValueError(f"op=Adasum cannot be combined with {', '.join(bad)}")

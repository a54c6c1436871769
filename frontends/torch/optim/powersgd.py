"""PowerSGD in ``commlib.torch.DistributedOptimizer``: low-rank gradient
compression with error feedback (the rule: commlib.powersgd).

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.powersgd(rank=2))

The backward hooks only mark gradients as final; ``step()`` (or
``synchronize()``) runs one exchange step of the rule over every gradient at
once (after ``backward_passes_per_step`` passes: on the accumulated
gradients): plain grouped allreduce for the first ``start_step`` exchanges,
then P and the uncompressed gradients in one fused allreduce and Q in a
second. Matrix products run where the gradients are (CPU or CUDA), in float32
for float16/bfloat16 gradients. ``state_dict()`` carries the rule's state
(exchange step, error buffers, Q) under ``"powersgd"``, so a restart from it
continues exactly.

Not combined with: ``staleness=1``, ``zero_stage > 0``, ``groups`` (all
gradients travel together anyway), ops other than Average and Sum, and sparse
gradients (use ``sparse_as_dense=True``).
"""
from __future__ import annotations

import torch

from commlib.powersgd import PowerSGD, PowerSGDState, as_config  # noqa: F401
from commlib.powersgd import check_options as _check_options

from .. import mpi_ops as _ops
from ..mpi_ops import Average, Sum
from .optimizer import DistributedOptimizerBase, share_state

_HALF = (torch.float16, torch.bfloat16)


def check_options(staleness, zero_stage, bucket_elements, groups) -> None:
    """ValueError for DistributedOptimizer options PowerSGD does not take."""
    _check_options(staleness, 1 if bucket_elements is not None else zero_stage, groups)


class TorchOps:
    """commlib.powersgd.TensorOps for torch tensors (CPU or CUDA)."""

    def __init__(self, op, scales, process_set):
        self.op, self.scales, self.process_set = op, scales, process_set

    @staticmethod
    def matrix(grad, rows, cols):
        m = grad.reshape(rows, cols)
        return m.float() if m.dtype in _HALF else m

    @staticmethod
    def restore(matrix, grad):
        return matrix.reshape(grad.shape).to(grad.dtype)

    @staticmethod
    def random(shape, generator, like):
        return torch.from_numpy(generator.standard_normal(shape)).to(like.device, like.dtype)

    matmul = staticmethod(torch.matmul)
    transpose = staticmethod(torch.t)
    columns = staticmethod(lambda m: m.unbind(1))
    stack_columns = staticmethod(lambda vectors: torch.stack(vectors, 1))
    dot = staticmethod(torch.dot)
    norm = staticmethod(torch.linalg.vector_norm)
    maximum = staticmethod(torch.clamp_min)

    @staticmethod
    def add_error(m, error):
        # M = G + E into the error buffer (E is not needed after this): the
        # gradient's own memory stays free to take the result P Q^T directly
        return error.add_(m) if error.dtype == m.dtype and error.device == m.device else m + error

    @staticmethod
    def residual(m, p, q, old_error, feedback, grad):
        # P Q^T straight into the gradient when m is not its memory (M is in
        # the error buffer), then error = M - P Q^T in place there: no
        # gradient-sized tensor is allocated or copied per step
        qt = q.t()
        if feedback and old_error is m:
            fits = grad.is_contiguous() and grad.dtype == m.dtype and grad.device == m.device
            m_hat = torch.mm(p, qt, out=grad.view(m.shape)) if fits else torch.mm(p, qt)
            return m_hat, m.addmm_(p, qt, alpha=-1)
        error = None
        if feedback:  # (the first compressed step: m is the gradient, or its float32 copy)
            reuse = old_error is not None and old_error.shape == m.shape \
                and old_error.dtype == m.dtype and old_error.device == m.device
            error = torch.addmm(m, p, qt, alpha=-1, out=old_error if reuse else None)
        return torch.mm(p, qt, out=m), error

    def allreduce(self, tensors, name):
        bufs = [t.contiguous() for t in tensors]
        pre, post = self.scales
        handle = _ops.grouped_allreduce_async_(bufs, name=name, op=self.op, prescale_factor=pre,
                                               postscale_factor=post,
                                               process_set=self.process_set)
        _ops.synchronize(handle)
        return bufs


class PowerSGDOptimizer(DistributedOptimizerBase):
    """Mixin placed before the wrapped optimizer's class: gradients go
    through the PowerSGD rule at synchronize()."""

    def _powersgd_init(self, config: PowerSGD):
        if self.op not in (Average, Sum):
            raise ValueError("compression=PowerSGD supports op=Average and op=Sum only")
        self._powersgd = PowerSGDState(
            config, [(self._parameter_names[p], tuple(p.shape)) for p in self._params],
            TorchOps(self.op, self._scales, self.process_set), name=self._internal("powersgd"))

    def _start(self, p):
        """Marks p's gradient final for this step (sent at synchronize())."""
        self._handles[p] = (None, None)

    def _start_sparse(self, p):
        raise ValueError(f"compression=PowerSGD needs dense gradients, but the gradient of "
                         f"{self._parameter_names[p]!r} is sparse; pass sparse_as_dense=True")

    def _wait_all(self):
        params = [p for p in self._params if p in self._handles]
        names = [self._parameter_names[p] for p in params]
        out = self._powersgd.reduce({n: p.grad for n, p in zip(names, params)})
        for n, p in zip(names, params):
            if out[n].data_ptr() != p.grad.data_ptr():  # (not written in place)
                p.grad.copy_(out[n])

    def state_dict(self):
        state = super().state_dict()
        state["powersgd"] = self._powersgd.state_dict()
        return state

    @staticmethod
    def without_own_state(state_dict):
        """The state_dict without what is each rank's own (the error buffers:
        each rank compresses its own gradients): what a broadcast of the
        optimizer's state sends."""
        if "powersgd" not in state_dict:
            return state_dict
        return dict(state_dict, powersgd=dict(state_dict["powersgd"], errors={}))

    def with_own_state(self, shared):
        """A received ``without_own_state`` result, with this rank's own part."""
        if "powersgd" not in shared:
            return shared
        return dict(shared, powersgd=dict(shared["powersgd"], errors=dict(self._powersgd.errors)))

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        powersgd = state_dict.pop("powersgd", None)
        if powersgd is not None:
            self._powersgd.check_state(powersgd)  # before anything is loaded
            devices = {self._parameter_names[p]: p.device for p in self._params}
            powersgd = dict(powersgd)
            for key in ("errors", "qs"):
                # (copies: the error buffers are updated in place)
                powersgd[key] = {n: t.to(devices[n], copy=True) for n, t in powersgd[key].items()}
        super().load_state_dict(state_dict)
        if powersgd is not None:
            self._powersgd.load_state_dict(powersgd)


def make_powersgd(cls, optimizer, config: PowerSGD, dist_args: tuple):
    """The PowerSGD DistributedOptimizer: ``cls`` is the generated class
    (PowerSGDOptimizer first, the wrapped optimizer's class last)."""
    dist = share_state(cls, optimizer, dist_args)
    dist._powersgd_init(config)
    return dist

"""SyncBatchNorm: batch normalisation over the batch of all ranks together.

In training, each rank computes the count, mean and squared deviations of its
own batch per channel; one allreduce sums its count, sums and sums of squares
(in float64) into the statistics of the global batch, so the output equals
BatchNorm's on the concatenation of all ranks' batches (a rank that joined
adds zeros: the statistics are the others'). Backward
allreduces the two per-channel sums the input gradient needs. Gradients of
weight and bias stay local (DistributedOptimizer averages them, as for any
parameter). Runs on CPU and CUDA tensors (Horovod's: CUDA only); on CUDA
nothing waits on the host (statistics stay on the device, the collectives
queue on the current stream). Each layer names its two collectives once, so
from its third step on they skip negotiation (the response cache, which
serves the global set).
``process_set=`` limits the statistics to a set's ranks (torch's
``process_group``); by default they are over every rank of the job.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from commlib.ops import owned_name
from commlib.process_sets import check_process_set, set_size

from .mpi_ops import Sum, allreduce_async, synchronize


class SyncBatchNorm(_BatchNorm):
    """Applies synchronous N-dimensional BatchNorm (input ``(N, C, ...)``):
    statistics are computed over the batches of all ranks.

    Arguments are those of torch.nn.BatchNorm*d: ``num_features``, ``eps``,
    ``momentum`` (None for a cumulative average), ``affine``,
    ``track_running_stats``; ``process_set`` (torch's ``process_group``):
    the ranks whose batches make the statistics (default: every rank). In
    eval mode with running statistics it is a plain BatchNorm with no
    communication. Every rank of the set must call forward (and backward)
    the same number of times."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None, process_set=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_set = process_set  # (checked when forward communicates)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        # Running statistics are updated only when tracked and training.
        track = not self.training or self.track_running_stats
        running_mean = self.running_mean if track else None
        running_var = self.running_var if track else None
        ps = check_process_set(self.process_set) if use_batch_stats else None
        if not use_batch_stats or set_size(ps) == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                use_batch_stats, factor, self.eps)
        # The layer's own names: its calls hit the response cache from its
        # third step on (generated names would negotiate every time).
        names = (owned_name(self, "SyncBatchNorm.stats", ps),
                 owned_name(self, "SyncBatchNorm.grad", ps))
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean,
                                            running_var, self.eps, factor, names, ps)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_set=None):
        """A copy of ``module`` with every BatchNorm*d replaced by a
        SyncBatchNorm carrying the same parameters and running statistics
        (over ``process_set``'s ranks, as torch's ``process_group``)."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats, process_set=process_set)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return out


def _compute_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum, names, ps):
        x = input  # (any strides: channels_last stays channels_last, uncopied)
        if x.dtype != _compute_dtype(x.dtype):
            x = x.to(_compute_dtype(x.dtype))
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, c] + [1] * (x.dim() - 2)
        count = x.numel() // c
        # Summed over ranks, in float64: [count, sum (c), sum of squares about 0
        # (c)], each rank's from its own mean and squared deviations.
        local = torch.empty(1 + 2 * c, dtype=torch.float64, device=x.device)
        local[0] = count
        if count:
            var, mean = torch.var_mean(x, dims, correction=0)
            mean = mean.to(torch.float64)
            local[1:1 + c] = mean * count
            local[1 + c:] = (var.to(torch.float64) + mean * mean) * count
        else:
            local[1:] = 0
        sums = synchronize(allreduce_async(local, op=Sum, name=names[0], process_set=ps))
        total = sums[0]
        # With 2 or more values here the global count is above 1; only ranks
        # with fewer read it (the same test on every rank: no rank differs).
        if count <= 1 and float(total) <= 1:
            raise ValueError("Expected more than 1 value per channel when training, got "
                             f"{int(total)} over all ranks")
        g_mean = sums[1:1 + c] / total
        g_m2 = (sums[1 + c:] - g_mean * sums[1:1 + c]).clamp_(min=0)
        g_var = g_m2 / total
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = g_m2 / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        mean_c = g_mean.to(x.dtype)
        invstd_c = torch.rsqrt(g_var + eps).to(x.dtype)
        # (x - mean) * invstd * weight + bias, in one pass.
        scale = invstd_c if weight is None else invstd_c * weight.to(x.dtype)
        shift = -mean_c * scale if bias is None else bias.to(x.dtype) - mean_c * scale
        y = torch.addcmul(shift.view(shape), x, scale.view(shape))
        ctx.save_for_backward(x, weight, mean_c, invstd_c, total.to(x.dtype))
        ctx.grad_name, ctx.ps = names[1], ps
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y if y.dtype == input.dtype else y.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        x, weight, mean, invstd, total = ctx.saved_tensors
        dy = grad_output
        if dy.dtype != x.dtype:
            dy = dy.to(x.dtype)
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, c] + [1] * (x.dim() - 2)
        xmu = x - mean.view(shape)
        sum_dy = dy.sum(dims)
        sum_dy_xmu = (dy * xmu).sum(dims)
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            # Every rank reaches this point (the graphs agree), so the
            # allreduce is matched everywhere.
            both = synchronize(allreduce_async(torch.cat([sum_dy, sum_dy_xmu]), op=Sum,
                                               name=ctx.grad_name, process_set=ctx.ps)) / total
            mean_dy, mean_dy_xmu = both[:c], both[c:]
            scale = invstd if weight is None else invstd * weight.to(x.dtype)
            # (dy - mean_dy - xmu * invstd^2 * mean_dy_xmu) * scale, in two passes
            grad_input = torch.addcmul((-mean_dy * scale).view(shape), dy, scale.view(shape))
            grad_input.addcmul_(xmu, (-invstd * invstd * mean_dy_xmu * scale).view(shape))
            if grad_input.dtype != grad_output.dtype:
                grad_input = grad_input.to(grad_output.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = (sum_dy_xmu * invstd).to(weight.dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(ctx.bias_dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None

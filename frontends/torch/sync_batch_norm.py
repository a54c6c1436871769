"""SyncBatchNorm: batch normalisation over the batch of all ranks together.

In training, each rank computes the count, mean and sum of squared deviations
of its own batch per channel; one allgather combines them (Chan's parallel
formula, in float64) into the statistics of the global batch, so the output
equals BatchNorm's on the concatenation of all ranks' batches. Backward
allreduces the two per-channel sums the input gradient needs. Gradients of
weight and bias stay local (DistributedOptimizer averages them, as for any
parameter). Runs on CPU tensors, unlike Horovod's (CUDA-only) version.
Like Horovod's, it has no ``process_set``: statistics are over every rank of
the job, so every rank must run it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .mpi_ops import Sum, allgather_async, allreduce_async, size, synchronize


class SyncBatchNorm(_BatchNorm):
    """Applies synchronous N-dimensional BatchNorm (input ``(N, C, ...)``):
    statistics are computed over the batches of all ranks.

    Arguments are those of torch.nn.BatchNorm*d: ``num_features``, ``eps``,
    ``momentum`` (None for a cumulative average), ``affine``,
    ``track_running_stats``. In eval mode with running statistics it is a
    plain BatchNorm with no communication. Every rank must call forward (and
    backward) the same number of times."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if input.device.type != "cpu":
            raise ValueError(f"SyncBatchNorm: input is on {input.device}; commlib.torch supports "
                             "CPU tensors only")
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
        if not use_batch_stats or size() == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias,
                                use_batch_stats, factor, self.eps)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean,
                                            running_var, self.eps, factor)

    @classmethod
    def convert_sync_batchnorm(cls, module):
        """A copy of ``module`` with every BatchNorm*d replaced by a
        SyncBatchNorm carrying the same parameters and running statistics."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child))
        return out


def _compute_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):
        x = input.contiguous().to(_compute_dtype(input.dtype))
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, c] + [1] * (x.dim() - 2)
        count = x.numel() // c
        if count:
            mean = x.mean(dims)
            m2 = ((x - mean.view(shape)) ** 2).sum(dims)
        else:
            mean = m2 = torch.zeros(c, dtype=x.dtype)
        local = torch.cat([torch.tensor([float(count)], dtype=torch.float64),
                           mean.to(torch.float64), m2.to(torch.float64)]).unsqueeze(0)
        stats = synchronize(allgather_async(local, name=None))
        counts, means, m2s = stats[:, 0], stats[:, 1:1 + c], stats[:, 1 + c:]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError("Expected more than 1 value per channel when training, got "
                             f"{int(total)} over all ranks")
        g_mean = (counts.unsqueeze(1) * means).sum(0) / total
        g_m2 = (m2s + counts.unsqueeze(1) * (means - g_mean) ** 2).sum(0)
        var = g_m2 / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = g_m2 / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        mean_c = g_mean.to(x.dtype)
        invstd_c = invstd.to(x.dtype)
        y = (x - mean_c.view(shape)) * invstd_c.view(shape)
        if weight is not None:
            y = y * weight.to(x.dtype).view(shape)
        if bias is not None:
            y = y + bias.to(x.dtype).view(shape)
        ctx.save_for_backward(x, weight, mean_c, invstd_c)
        ctx.total = total
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        x, weight, mean, invstd = ctx.saved_tensors
        dy = grad_output.contiguous().to(x.dtype)
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
            both = synchronize(allreduce_async(torch.cat([sum_dy, sum_dy_xmu]), op=Sum))
            mean_dy = both[:c] / ctx.total
            mean_dy_xmu = both[c:] / ctx.total
            scale = invstd if weight is None else invstd * weight.to(x.dtype)
            grad_input = ((dy - mean_dy.view(shape)
                           - xmu * (invstd ** 2 * mean_dy_xmu).view(shape)) * scale.view(shape))
            grad_input = grad_input.to(grad_output.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = (sum_dy_xmu * invstd).to(weight.dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(ctx.bias_dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None

"""reducescatter and grouped_reducescatter on torch tensors (Horovod's names
and arguments), differentiable with Horovod's gradient; see mpi_ops."""
from __future__ import annotations

import torch

from commlib import runtime
from commlib.ops import Average, reducescatter_described
from commlib.process_sets import check_process_set, global_process_set, set_size
from commlib.refusals import refused
from commlib.reduce_args import reducescatter_grad_scale, resolve_op
from commlib.submit import NULL, address

from .compression import Compression
from ..cuda.cuda_dispatch import on_cuda
from .handles import Handle, synchronize
from .gather_ops import allgather, grouped_allgather_async, submit_members
from .tensor_io import input_facts, records_grad, tensor_list

# ---------------------------------------------------------------- reducescatter

@on_cuda("reducescatter")
def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    """Starts reducing ``tensor`` over all ranks (of ``process_set``), leaving
    on each rank its part of dimension 0 (part i on the set's i-th member;
    lower positions get the extra rows)."""
    mark = runtime.generated
    try:
        process_set = check_process_set(process_set)
        f, tensor = input_facts(tensor, "reducescatter_async", rows_of="reducescatter")
        return reducescatter_described(f, tensor, name, op, prescale_factor, postscale_factor,
                                       process_set, _new_part)
    except (TypeError, ValueError) as e:
        refused(e, "reducescatter", name, process_set, mark)
        raise


def _new_part(shape, f):
    """reducescatter_described's new result: a tensor of ``shape`` and the dtype of ``f``'s."""
    out = torch.empty(*shape, dtype=f.tdtype)  # (unpacked: faster than a tuple)
    return (address(out.data_ptr()) if out.numel() else NULL), out


class HorovodReducescatter(torch.autograd.Function):
    """reducescatter as an autograd function, with Horovod's gradient: the
    allgather (over the same process set) of the output gradients times
    ``reducescatter_grad_scale`` (size x prescale x postscale for Sum, prescale x
    postscale otherwise)."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        op = resolve_op(op)
        ctx.scale = reducescatter_grad_scale(op, set_size(process_set), prescale_factor,
                                             postscale_factor)
        ctx.process_set = process_set
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allgather((grad_output * ctx.scale).contiguous(), process_set=ctx.process_set)
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0,
                  postscale_factor=1.0) -> torch.Tensor:
    """This rank's part of the reduction of ``tensor`` over all ranks (of
    ``process_set``); differentiable: the gradient is Horovod's, the
    allgather of the output gradient times the set's size for Sum and times
    ``prescale_factor * postscale_factor`` for every op."""
    mark = runtime.generated
    try:
        process_set = check_process_set(process_set)
        if (compression is Compression.none and isinstance(tensor, torch.Tensor) and tensor.is_cpu
                and not records_grad(tensor)):  # (waited for at once: no Handle)
            f, tensor = input_facts(tensor, "reducescatter", rows_of="reducescatter")
            return reducescatter_described(f, tensor, name, op, prescale_factor, postscale_factor,
                                           process_set, _new_part, wait=True)
        compressed, cctx = compression.compress(tensor)
        if records_grad(compressed):
            out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                             postscale_factor)
        else:
            out = synchronize(reducescatter_async(compressed, name, op, process_set, prescale_factor,
                                                  postscale_factor))
        return compression.decompress(out, cctx)
    except (TypeError, ValueError) as e:
        refused(e, "reducescatter", name, process_set, mark)
        raise


@on_cuda("grouped_reducescatter")
def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    return submit_members("reducescatter", tensors, name, process_set,
                          lambda t, n, ps: reducescatter_async(t, n, op, ps, prescale_factor, postscale_factor))


class HorovodGroupedReducescatter(torch.autograd.Function):
    """grouped_reducescatter as an autograd function: as for reducescatter
    (Horovod's gradient), the output gradients times ``reducescatter_grad_scale``, in one
    grouped allgather."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        op = resolve_op(op)
        ctx.scale = reducescatter_grad_scale(op, set_size(process_set), prescale_factor,
                                             postscale_factor)
        ctx.process_set = process_set
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set,
                                                             prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = synchronize(grouped_allgather_async(
            [(g * ctx.scale).contiguous() for g in grad_outputs], process_set=ctx.process_set))
        return (None, None, None, None, None, *grads)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor of a list, negotiated as one group;
    differentiable as reducescatter (Horovod's gradient)."""
    process_set = check_process_set(process_set)
    pairs = [compression.compress(t) for t in tensor_list(tensors, "grouped_reducescatter")]
    compressed = [p[0] for p in pairs]
    if records_grad(*compressed):
        outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                                 postscale_factor, *compressed)
    else:
        outs = synchronize(grouped_reducescatter_async(compressed, name, op, process_set,
                                                       prescale_factor, postscale_factor))
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]

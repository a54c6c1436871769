"""allreduce, grouped_allreduce and sparse_allreduce on torch tensors
(Horovod's names and arguments; the out-of-place forms are differentiable);
see mpi_ops for the conventions they share."""
from __future__ import annotations

import torch

import commlib as _c
from commlib import runtime
from commlib.grouped_ops import submit_group
from commlib.handle import wait_for
from commlib.ops import Adasum, Average, Max, Min, Sum, allreduce_fresh, allreduce_in_place, allreduce_waited
from commlib.process_sets import check_process_set, global_process_set
from commlib.refusals import refused
from commlib.reduce_args import resolve_op
from commlib.submit import NULL, address, remember_quick, submit_again

from .compression import Compression
from ..cuda import cuda_nccl
from ..cuda.cuda_dispatch import on_cuda
from .handles import Handle, synchronize
from .tensor_io import (as_tensor, cached_facts, check_tensor, describe, facts_of, group_layout,
                        group_outputs, host_code, input_array, records_grad, tensor_list)

# ---------------------------------------------------------------- allreduce

def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, what,
                     process_set):
    # (the core handle itself: synchronize returns ``output``, or the new result)
    if output is None:  # out of place: the result goes into a new tensor
        f = cached_facts(tensor)
        if f is None:  # (a tensor not described yet, or changed since: checked)
            tensor = check_tensor(tensor, what)
            if not tensor.is_contiguous():
                tensor = tensor.contiguous()
            f = describe(tensor, what)
        out = torch.empty_like(tensor)
        return allreduce_in_place(f, tensor, name, op, prescale_factor, postscale_factor, process_set,
                                  (address(out.data_ptr()) if out.numel() else NULL, out))
    return allreduce_in_place(describe(output, what), output, name, op, prescale_factor,
                              postscale_factor, process_set)


@on_cuda("allreduce")
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Starts reducing ``tensor`` over all ranks (of ``process_set``; default
    op Average, which divides by the set's size; the input is not modified).
    Returns a handle for ``synchronize``.

    The reduction is keyed by ``name`` (auto-generated when None): tensors of
    one name must have the same shape and dtype on every rank, or every rank
    raises commlib.CollectiveMismatchError."""
    mark = runtime.generated
    try:
        process_set = check_process_set(process_set)
        op = resolve_op(op, average)
        return _allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor,
                                "allreduce_async", process_set)
    except (TypeError, ValueError) as e:
        refused(e, "allreduce", name, process_set, mark)
        raise


_PLAIN_OPS = frozenset((Sum, Average, Min, Max, Adasum, _c.Product))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """In-place ``allreduce_async``: the result is written into ``tensor``."""
    mark = runtime.generated
    try:
        quick = _quick(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
        if quick is not None:
            f, given, hid = quick
            if hid:
                return _c.Handle(hid, None, tensor, "allreduce", tensor)
            if op is None or op in _PLAIN_OPS:
                h = allreduce_in_place(f, tensor, name, Average if op is None else op,
                                       prescale_factor, postscale_factor)
                if type(name) is str:
                    remember_quick(f, given)
                return h
        elif type(name) is str and average is None and process_set is global_process_set:
            h = cuda_nccl.allreduce_again(tensor, name, op, prescale_factor, postscale_factor)
            if h is not None:
                return h
        return _allreduce_async_checked(tensor, average, name, op, prescale_factor, postscale_factor,
                                        process_set)
    except (TypeError, ValueError) as e:
        refused(e, "allreduce", name, process_set, mark)
        raise


def _quick(tensor, average, name, op, prescale_factor, postscale_factor, process_set):
    """A training loop's repeated in-place call (a CPU tensor described
    before and unchanged since, a plain op, the global set) goes straight to
    the core's request, submitted again as it is when the arguments repeat
    word for word (a given name), else built from the cached facts: returns
    ``(facts, arguments, handle id or 0 when nothing was submitted)``; None
    for anything else, which takes the checked way."""
    if average is None and process_set is global_process_set and (op is None or type(op) is int):
        f = facts_of(id(tensor))
        if f is not None and f.holds(tensor):
            given = (name, op, prescale_factor, postscale_factor)
            return f, given, submit_again(f, given)
    return None


def _checked(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
             process_set=global_process_set) -> Handle:
    process_set = check_process_set(process_set)
    op = resolve_op(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            "allreduce_async_", process_set)


_checked.__name__ = "allreduce_async_"  # (the name on_cuda's messages give)
_allreduce_async_checked = on_cuda("allreduce", inplace=True)(_checked)
# Like the other CUDA-aware collectives, __wrapped__ is the host-only function
# (the fast path above only ever takes CPU tensors).
allreduce_async_.__wrapped__ = _checked

def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """In-place allreduce; returns ``tensor``."""
    mark = runtime.generated
    try:
        quick = _quick(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
        if quick is not None and quick[2]:  # (a repeated call waited for at once: no Handle)
            return wait_for(quick[2], tensor)
        return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                            postscale_factor, process_set))
    except (TypeError, ValueError) as e:
        refused(e, "allreduce", name, process_set, mark)
        raise


class HorovodAllreduce(torch.autograd.Function):
    """allreduce as an autograd function: the gradient is the allreduce (same
    op, scale factors and process set) of the output gradients, as in
    Horovod. Min/Max send the gradient to the rank(s) that hold the extreme
    value."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op = resolve_op(op, average)
        ctx.scales = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        out = synchronize(allreduce_async(tensor, None, name, ctx.op, prescale_factor,
                                          postscale_factor, process_set))
        if ctx.op in (Min, Max):
            ctx.save_for_backward(tensor, out)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        op, ps = ctx.op, ctx.process_set
        pre, post = ctx.scales
        if op in (Sum, Average, Adasum):  # (Adasum: Horovod's, the op of the forward)
            grad = allreduce(grad_output, op=op, prescale_factor=pre, postscale_factor=post,
                             process_set=ps)
        elif op in (Min, Max):
            tensor, out = ctx.saved_tensors
            hit = (tensor * pre * post == out).to(grad_output.dtype)
            ties = allreduce(hit, op=Sum, process_set=ps)
            grad = (allreduce(grad_output, op=Sum, process_set=ps) * hit * pre * post
                    / ties.clamp_min(1))
        else:
            raise NotImplementedError("the gradient of a Product allreduce is not implemented")
        return grad, None, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set) -> torch.Tensor:
    """The reduction (default Average) of ``tensor`` over all ranks (of
    ``process_set``), as a new tensor; differentiable. ``compression`` (e.g.
    Compression.fp16) casts the tensor for the transfer and back."""
    mark = runtime.generated
    try:
        if (compression is Compression.none and process_set is global_process_set and average is None
                and (op is None or (type(op) is int and op in _PLAIN_OPS))):
            # (waited for at once: a CPU tensor described before and unchanged since, or, with a
            # given name, any plain CPU tensor, as a metric's new tensor each step)
            f = cached_facts(tensor)
            code = None if f is not None or type(name) is not str else host_code(tensor)
            if (f is not None or code is not None) and not (tensor.requires_grad and torch.is_grad_enabled()):
                out = torch.empty_like(tensor)  # (contiguous like the tensor; cheaper than torch.empty)
                rop, dst = Average if op is None else op, (address(out.data_ptr()) if out.numel() else NULL, out)
                if f is not None:
                    return allreduce_waited(f, tensor, name, rop, prescale_factor, postscale_factor, dst)
                return allreduce_fresh(code, tuple(tensor.shape) or (1,), address(tensor.data_ptr()) if out.numel()
                                       else NULL, tensor, name, rop, prescale_factor, postscale_factor, dst)
        process_set = check_process_set(process_set)
        args = (average, name, op, prescale_factor, postscale_factor, process_set)
        if compression is Compression.none:  # (nothing to cast: no compress/decompress calls)
            return _reduced(tensor, *args)
        compressed, cctx = compression.compress(tensor)
        return compression.decompress(_reduced(compressed, *args), cctx)
    except (TypeError, ValueError) as e:
        refused(e, "allreduce", name, process_set, mark)
        raise


def _reduced(tensor, *args) -> torch.Tensor:
    """allreduce's result: through its autograd function where autograd
    records the call, else straight from allreduce_async."""
    if records_grad(tensor):
        return HorovodAllreduce.apply(tensor, *args)
    return synchronize(allreduce_async(tensor, *args))


# ---------------------------------------------------------------- grouped allreduce

def _grouped_allreduce_async(tensors, inplace, average, name, op, prescale_factor,
                             postscale_factor, process_set, what) -> Handle:
    mark = runtime.generated
    try:
        process_set = check_process_set(process_set)
        op = resolve_op(op, average)
        tensors = list(tensors)
        if not tensors:
            raise ValueError(f"{what} needs at least one tensor")
        layout = group_layout(tensors, what, inplace)
        if layout is None:  # (a non-contiguous input: copied, through numpy views)
            h = _c.grouped_allreduce_async([input_array(t, what) for t in tensors], None, name, op,
                                           prescale_factor, postscale_factor, process_set)
            shapes = [t.shape for t in tensors]
            return Handle(h, lambda outs: [as_tensor(o).view(s) for o, s in zip(outs, shapes)], tensors)
        outs, keep = (tensors, (layout.ptrs,)) if inplace else group_outputs(layout, tensors)
        hid = submit_group(layout, keep[0], None, name, op, prescale_factor, postscale_factor,
                           process_set)
        return _c.Handle(hid, None, (layout, keep, tensors, outs), "grouped_allreduce", outs)
    except (TypeError, ValueError) as e:
        refused(e, "allreduce", name, process_set, mark)
        raise


@on_cuda("grouped_allreduce")
def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Starts reducing a list of tensors as one unit (fused together); the
    handle's result is a list of new tensors."""
    return _grouped_allreduce_async(tensors, False, average, name, op, prescale_factor,
                                    postscale_factor, process_set, "grouped_allreduce_async")


@on_cuda("grouped_allreduce", inplace=True)
def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """In-place ``grouped_allreduce_async``: results are written into the tensors."""
    return _grouped_allreduce_async(tensors, True, average, name, op, prescale_factor,
                                    postscale_factor, process_set, "grouped_allreduce_async_")


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op = resolve_op(op, average)
        ctx.scales = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), None, name, ctx.op,
                                                         prescale_factor, postscale_factor,
                                                         process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        if ctx.op not in (Sum, Average, Adasum):
            raise NotImplementedError("grouped_allreduce is differentiable for Sum, Average and "
                                      "Adasum only")
        pre, post = ctx.scales
        grads = grouped_allreduce(list(grad_outputs), op=ctx.op, prescale_factor=pre,
                                  postscale_factor=post, process_set=ctx.process_set)
        return (None, None, None, None, None, None, *grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces a list of tensors as one fused unit; returns a list of new
    tensors. Differentiable for Sum, Average and Adasum."""
    mark = runtime.generated
    try:
        process_set = check_process_set(process_set)
        tensors = tensor_list(tensors, "grouped_allreduce")
        if compression is Compression.none:  # (nothing to cast: no per-tensor calls)
            if not records_grad(*tensors):
                return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                                           postscale_factor, process_set))
            return list(HorovodGroupedAllreduce.apply(average, name, op, prescale_factor,
                                                      postscale_factor, process_set, *tensors))
        pairs = [compression.compress(t) for t in tensors]
        outs = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                             process_set, *[p[0] for p in pairs])
        return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]
    except (TypeError, ValueError) as e:
        refused(e, "allreduce", name, process_set, mark)
        raise

"""allgather, grouped_allgather, broadcast and alltoall on torch tensors
(Horovod's names and arguments), each differentiable in its out-of-place
form; see mpi_ops for the conventions they share."""
from __future__ import annotations

import numpy as np
import torch

import commlib as _c
from commlib import runtime
from commlib.checks import check_has_rows
from commlib.ops import (Average, allgather_described, allgather_fresh, alltoall_described, alltoall_rows,
                         auto_name, broadcast_in_place)
from commlib.process_sets import check_process_set, global_process_set, set_rank
from commlib.refusals import refused, refused_members
from commlib.submit import NULL, address

from .allreduce_ops import allreduce, grouped_allreduce_async
from ..cuda.cuda_dispatch import on_cuda
from .handles import Handle, synchronize
from .tensor_io import (cached_facts, check_tensor, describe, host_code, input_facts, records_grad,
                        rows_as_tensor, split_list, tensor_list, tensor_rows)

# ---------------------------------------------------------------- allgather

@on_cuda("allgather")
def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Starts concatenating every rank's ``tensor`` along dimension 0 (whose
    size may differ across ranks; the other dimensions must agree), in the
    order of the ranks (of ``process_set``)."""
    mark = runtime.generated
    try:
        process_set = check_process_set(process_set)
        f, tensor = input_facts(tensor, "allgather_async", rows_of="allgather")
        return allgather_described(f, tensor, name, process_set, tensor_rows)
    except (TypeError, ValueError) as e:
        refused(e, "allgather", name, process_set, mark)
        raise


class HorovodAllgather(torch.autograd.Function):
    """allgather as an autograd function. As in Horovod, the gradient of each
    rank's slice is the average over ranks (of the process set) of the output
    gradients."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0]
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        ps = ctx.process_set
        # Deliberate: horovod.torch averages the upstream gradients (commlib.tensorflow sums).
        grad = allreduce(grad_output.contiguous(), op=Average, process_set=ps)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ps)
        offset = int(dims[:set_rank(ps)].sum())
        return grad.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Every rank's ``tensor`` (of ``process_set``) concatenated along
    dimension 0, in rank order; differentiable."""
    mark = runtime.generated
    try:
        process_set = check_process_set(process_set)
        if not records_grad(tensor):
            if isinstance(tensor, torch.Tensor) and tensor.is_cpu:  # (waited for at once: no Handle)
                fresh = (type(name) is str and process_set is global_process_set and tensor.dim()
                         and cached_facts(tensor) is None)  # (a new tensor each call, as a metric's)
                code = host_code(tensor) if fresh else None
                if code is not None:
                    return allgather_fresh(code, tuple(tensor.shape), address(tensor.data_ptr()) if tensor.numel()
                                           else NULL, tensor, name, rows_as_tensor(tensor.dtype, tuple(tensor.shape[1:])))
                f, tensor = input_facts(tensor, "allgather", rows_of="allgather")
                return allgather_described(f, tensor, name, process_set, tensor_rows, wait=True)
            return synchronize(allgather_async(tensor, name, process_set))  # (CUDA, or refused there)
        check_has_rows(check_tensor(tensor, "allgather").dim(), "allgather")  # (before forward reads its rows)
        return HorovodAllgather.apply(tensor, name, process_set)
    except (TypeError, ValueError) as e:
        refused(e, "allgather", name, process_set, mark)
        raise


@on_cuda("grouped_allgather")
def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> Handle:
    return submit_members("allgather", tensors, name, process_set, allgather_async)


class HorovodGroupedAllgather(torch.autograd.Function):
    """grouped_allgather as an autograd function: as for allgather, each
    rank's slice of every output gradient, averaged over the set (one grouped
    allreduce and one allgather of the first dimensions)."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] if t.dim() else 0 for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        ps = ctx.process_set
        grads = synchronize(grouped_allreduce_async([g.contiguous() for g in grad_outputs],
                                                    op=Average, process_set=ps))
        dims = synchronize(allgather_async(torch.tensor([ctx.dims], dtype=torch.int64),
                                           process_set=ps))
        offsets = dims[:set_rank(ps)].sum(0).tolist()
        return (None, None, *[g.narrow(0, off, d) for g, off, d in zip(grads, offsets, ctx.dims)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of each tensor of a list, negotiated as one group;
    differentiable (Horovod's gradients, as for allgather)."""
    process_set = check_process_set(process_set)
    tensors = tensor_list(tensors, "grouped_allgather")
    if not records_grad(*tensors):
        return list(synchronize(grouped_allgather_async(tensors, name, process_set)))
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ---------------------------------------------------------------- broadcast

@on_cuda("broadcast")
def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """Starts copying rank ``root_rank``'s ``tensor`` to every rank (of
    ``process_set``; root_rank is a job rank in it); the result is a new
    tensor (the input is not modified)."""
    mark = runtime.generated
    try:
        return _broadcast_new(tensor, root_rank, name, check_process_set(process_set), "broadcast_async")
    except (TypeError, ValueError) as e:
        refused(e, "broadcast", name, process_set, mark)
        raise


def _broadcast_new(tensor, root_rank, name, process_set, what: str, wait: bool = False):
    """broadcast_in_place of a host tensor into a new tensor (the input's
    shape, 0-d included; contiguous); ``wait``: the result itself."""
    f, tensor = input_facts(tensor, what)
    out = torch.empty_like(tensor)
    return broadcast_in_place(f, tensor, root_rank, name, process_set,
                              (address(out.data_ptr()) if out.numel() else NULL, out), wait=wait)


@on_cuda("broadcast", inplace=True)
def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """In-place ``broadcast_async``: ``tensor`` receives root's value."""
    mark = runtime.generated
    try:
        process_set = check_process_set(process_set)
        # (the core handle itself: synchronize returns ``tensor``)
        return broadcast_in_place(describe(tensor, "broadcast_async_"), tensor, root_rank, name, process_set)
    except (TypeError, ValueError) as e:
        refused(e, "broadcast", name, process_set, mark)
        raise


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    mark = runtime.generated
    try:
        if isinstance(tensor, torch.Tensor) and tensor.is_cpu:  # (waited for at once: no Handle)
            process_set = check_process_set(process_set)
            return broadcast_in_place(describe(tensor, "broadcast_"), tensor, root_rank, name, process_set,
                                      wait=True)
        return synchronize(broadcast_async_(tensor, root_rank, name, process_set))
    except (TypeError, ValueError) as e:
        refused(e, "broadcast", name, process_set, mark)
        raise


class HorovodBroadcast(torch.autograd.Function):
    """broadcast as an autograd function. As in Horovod, the root receives
    the average over ranks (of the process set) of the output gradients,
    other ranks zero."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        # Deliberate: horovod.torch averages the upstream gradients (commlib.tensorflow sums).
        grad = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        if _c.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """Rank ``root_rank``'s ``tensor``, on every rank (of ``process_set``), as
    a new tensor; differentiable."""
    mark = runtime.generated
    try:
        process_set = check_process_set(process_set)
        if not records_grad(tensor):
            if isinstance(tensor, torch.Tensor) and tensor.is_cpu:  # (waited for at once: no Handle)
                return _broadcast_new(tensor, root_rank, name, process_set, "broadcast", wait=True)
            return synchronize(broadcast_async(tensor, root_rank, name, process_set))
        return HorovodBroadcast.apply(tensor, root_rank, name, process_set)
    except (TypeError, ValueError) as e:
        refused(e, "broadcast", name, process_set, mark)
        raise


# ---------------------------------------------------------------- alltoall

def check_group(tensors, what: str) -> list:
    """The list of a grouped collective, checked whole before any is sent."""
    tensors = tensor_list(tensors, what)
    for t in tensors:
        check_has_rows(check_tensor(t, what).dim(), what, several=True)
    return tensors


def submit_members(kind: str, tensors, name, process_set, start) -> Handle:
    """A grouped allgather or reducescatter (``kind``): one request per
    tensor, ``start(tensor, "<base>.<i>", process_set)``, where base is the
    call's name (generated first: a refused group uses up its name too); the
    handle's result is the list of results. A group refused on this rank,
    whole or at one of its tensors, is told to the other ranks for every
    request it will not submit (commlib.refusals.refused_members)."""
    process_set = check_process_set(process_set)
    base = auto_name(f"grouped_{kind}", name, process_set)
    count = len(tensors) if isinstance(tensors, (list, tuple)) else None
    handles = []
    try:
        tensors = check_group(tensors, f"grouped_{kind}")
        count = len(tensors)
        for i, t in enumerate(tensors):
            handles.append(start(t, f"{base}.{i}", process_set))
    except (TypeError, ValueError) as e:
        refused_members(e, kind, base, len(handles), count, process_set)
        raise
    return Handle.of_group(handles, list, tensors)


@on_cuda("alltoall")
def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Starts an all-to-all: rows ``splits[i]`` of dimension 0 go to rank i
    (of ``process_set``: its i-th member; an even division when splits is
    None). ``synchronize`` returns ``(output, received_splits)``, as in
    Horovod."""
    mark = runtime.generated
    try:
        process_set = check_process_set(process_set)
        f, tensor = input_facts(tensor, "alltoall_async", rows_of="alltoall")
        if splits is not None:
            splits = split_list(splits, f.tshape[0], process_set)
        return alltoall_described(f, tensor, splits, name, process_set, _alltoall_result)
    except (TypeError, ValueError) as e:
        refused(e, "alltoall", name, process_set, mark)
        raise


def _alltoall_result(f):
    """alltoall_described's result for a tensor: the received rows as a
    tensor and the rows from each rank as an int32 tensor, as Horovod's."""
    rows = tensor_rows(f)
    return lambda data, nrows, received: (rows(data, nrows), torch.from_numpy(np.array(received, np.int32)))


class HorovodAlltoall(torch.autograd.Function):
    """alltoall as an autograd function: the gradient travels back with the
    received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.process_set = process_set
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, *_unused):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received,
                                             process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """All-to-all; returns the received rows (in rank order) and, when
    ``splits`` is given, also the rows received from each rank."""
    mark = runtime.generated
    try:
        process_set = check_process_set(process_set)
        if not records_grad(tensor):
            host = isinstance(tensor, torch.Tensor) and tensor.is_cpu  # (no device routing to look at)
            if host and splits is None and type(name) is str:  # (waited for at once: no Handle, no splits)
                f, tensor = input_facts(tensor, "alltoall", rows_of="alltoall")
                return alltoall_rows(f, tensor, name, process_set, tensor_rows)
            start = alltoall_async.__wrapped__ if host else alltoall_async
            out, received = synchronize(start(tensor, splits, name, process_set))
            return out if splits is None else (out, received)
        return HorovodAlltoall.apply(tensor, splits, name, process_set)
    except (TypeError, ValueError) as e:
        refused(e, "alltoall", name, process_set, mark)
        raise

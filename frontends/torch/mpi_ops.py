"""Collectives on torch tensors, with Horovod's names, arguments and defaults.

CPU tensors are handed to the core without copies: ``tensor.numpy()`` shares
the tensor's memory, so in-place operations (``allreduce_``, ``broadcast_``,
...) write straight into the tensor, and out-of-place results are the core's
freshly allocated arrays wrapped with ``torch.from_numpy``.

The out-of-place forms (``allreduce``, ``allgather``, ``broadcast``,
``alltoall``, ``reducescatter`` and the grouped forms) are differentiable
(torch.autograd.Function), with Horovod's gradients.

The framework-free parts, shared with commlib.tensorflow, come from commlib:
op resolution (``reduce_args``), process-set checks and sizes
(``process_sets``), generated names and broadcast's root check (``ops``),
Horovod's ``*_built`` queries (``capabilities``).

Process sets work as in horovod.torch: every collective takes
``process_set=`` (``global_process_set``, the default, or a ``ProcessSet``
registered on every rank with ``add_process_set`` or
``init(process_sets=[...])``). Only the set's members call a collective on
it (a non-member gets ValueError before anything is sent); Average divides
by the set's size, allgather/alltoall order rows by the set's ranks,
alltoall splits and reducescatter parts go to the set's members in order,
and ``root_rank`` is a job rank that belongs to the set. The gradients of
the differentiable collectives are collectives over the same set.

Differences from horovod.torch, all deliberate:

* CPU tensors only: a tensor on another device raises ValueError (the core has
  no GPU path yet).
* ``Adasum`` raises NotImplementedError instead of reducing.
* ``join()`` is a collective that every rank must call; it does not serve
  other ranks' collectives with zeros while they finish (see its docstring).
* ``synchronize`` on an already synchronized handle raises ValueError.
"""
from __future__ import annotations

import numpy as np
import torch

import commlib as _c
from commlib import CommlibError
from commlib import dtypes as _dtypes
from commlib.basics import init, is_homogeneous  # noqa: F401 - re-exported
from commlib.capabilities import (  # noqa: F401 - re-exported
    ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, mpi_built, mpi_enabled,
    nccl_built, rocm_built)
from commlib.errors import ScalarTensorError
from commlib.ops import Adasum, Average, Max, Min, Product, Sum, auto_name, even_splits
from commlib.process_sets import (  # noqa: F401 - re-exported
    ProcessSet, add_process_set, check_process_set, global_process_set, remove_process_set,
    set_rank, set_size)
from commlib.reduce_args import resolve_op
from commlib.runtime import require_init

from .compression import Compression

# ---------------------------------------------------------------- basics

shutdown = _c.shutdown
is_initialized = _c.is_initialized
size = _c.size
rank = _c.rank
local_size = _c.local_size
local_rank = _c.local_rank
cross_size = _c.cross_size
cross_rank = _c.cross_rank
mpi_threads_supported = _c.mpi_threads_supported


# ---------------------------------------------------------------- tensors <-> arrays

# commlib.dtypes' table, by name (torch builds without a dtype skip it)
SUPPORTED_DTYPES = tuple(getattr(torch, name) for name in _dtypes.SUPPORTED if hasattr(torch, name))
_SUPPORTED_NAMES = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
_bf16 = None


def _bfloat16_dtype():
    global _bf16
    if _bf16 is None:
        try:
            import ml_dtypes
        except ImportError as e:  # pragma: no cover - depends on the install
            raise TypeError("bfloat16 tensors need the ml_dtypes package "
                            "(pip install ml_dtypes)") from e
        _bf16 = np.dtype(ml_dtypes.bfloat16)
    return _bf16


def check_tensor(tensor, what: str, inplace: bool = False) -> torch.Tensor:
    """Checks that commlib can move ``tensor``: a dense CPU tensor of a
    supported dtype (and contiguous, when the result is written into it)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} expects a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(
            f"{what}: tensor is on device {tensor.device}, but commlib.torch supports CPU "
            "tensors only (there is no GPU/NCCL path yet); move it with tensor.cpu()")
    if tensor.layout != torch.strided:
        raise TypeError(f"{what}: {tensor.layout} tensors are not supported; "
                        "use a dense tensor (tensor.to_dense())")
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{what}: unsupported dtype {tensor.dtype}; commlib supports "
                        f"{_SUPPORTED_NAMES}")
    if inplace and not tensor.is_contiguous():
        raise ValueError(f"{what} writes its result into the tensor, which must be "
                         "contiguous; call tensor.contiguous() first")
    return tensor


def _as_array(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's memory (no copy). 0-d
    tensors become 1-element 1-d views, which the core always handles."""
    t = tensor.detach()
    if t.dtype == torch.bfloat16:
        arr = t.view(torch.int16).numpy().view(_bfloat16_dtype())
    else:
        arr = t.numpy()
    return arr.reshape(1) if arr.ndim == 0 else arr


def _as_tensor(arr: np.ndarray) -> torch.Tensor:
    """A tensor sharing the memory of a (writable) numpy array."""
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _input(tensor, what: str) -> np.ndarray:
    """A zero-copy array of ``tensor`` (a contiguous copy if it is not)."""
    t = check_tensor(tensor, what)
    return _as_array(t if t.is_contiguous() else t.contiguous())


# ---------------------------------------------------------------- handles

class Handle:
    """An in-flight collective on torch tensors; pass it to ``poll`` or
    ``synchronize``. It keeps the tensors involved alive until then."""

    __slots__ = ("_handles", "_finish", "_keep")

    def __init__(self, handles, finish, keep=None):
        self._handles = handles  # one commlib.Handle or a list of them
        self._finish = finish  # core result(s) -> torch result
        self._keep = keep

    def __repr__(self):
        return f"<commlib.torch.Handle {self._handles!r}>"


class CallableHandle(Handle):
    """A Handle that is also called to wait for its result, as the handle
    Horovod's ``sparse_allreduce_async`` returns: ``handle()`` is
    ``synchronize(handle)``."""

    __slots__ = ()

    def __call__(self):
        return synchronize(self)


def poll(handle) -> bool:
    """True when the collective has completed (``synchronize`` will not block)."""
    if isinstance(handle, _c.Handle):
        return _c.poll(handle)
    if not isinstance(handle, Handle):
        raise TypeError(f"expected a handle from an *_async call, got {type(handle).__name__}")
    hs = handle._handles
    if isinstance(hs, list):
        return all(_c.poll(h) for h in hs)
    return _c.poll(hs)


def synchronize(handle):
    """Waits for an asynchronous collective and returns its result: the output
    tensor (the input tensor itself for in-place forms), a list for grouped
    forms, ``(output, received_splits)`` for alltoall."""
    if isinstance(handle, _c.Handle):
        return _c.synchronize(handle)
    if not isinstance(handle, Handle):
        raise TypeError(f"expected a handle from an *_async call, got {type(handle).__name__}")
    hs = handle._handles
    if isinstance(hs, list):
        results, first_error = [], None
        for h in hs:  # wait for every member even if one fails
            try:
                results.append(_c.synchronize(h))
            except Exception as e:  # noqa: BLE001 - re-raised below
                results.append(None)
                first_error = first_error or e
        if first_error is not None:
            raise first_error
        return handle._finish(results)
    return handle._finish(_c.synchronize(hs))


# ---------------------------------------------------------------- allreduce

def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, what,
                     process_set):
    if output is None:  # out of place: the core allocates the result
        arr = _input(tensor, what)
        h = _c.allreduce_async(arr, None, name, op, prescale_factor, postscale_factor,
                               process_set=process_set)
        shape = tensor.shape
        return Handle(h, lambda out: _as_tensor(out).view(shape), tensor)
    check_tensor(output, what, inplace=True)
    h = _c.allreduce_async_(_as_array(output), None, name, op, prescale_factor, postscale_factor,
                            process_set=process_set)
    return Handle(h, lambda _out: output, output)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Starts reducing ``tensor`` over all ranks (of ``process_set``; default
    op Average, which divides by the set's size; the input is not modified).
    Returns a handle for ``synchronize``.

    The reduction is keyed by ``name`` (auto-generated when None): tensors of
    one name must have the same shape and dtype on every rank, or every rank
    raises commlib.CollectiveMismatchError."""
    process_set = check_process_set(process_set)
    op = resolve_op(op, average)
    return _allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor,
                            "allreduce_async", process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """In-place ``allreduce_async``: the result is written into ``tensor``."""
    process_set = check_process_set(process_set)
    op = resolve_op(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            "allreduce_async_", process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """In-place allreduce; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


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
        if op in (Sum, Average):
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
    process_set = check_process_set(process_set)
    compressed, cctx = compression.compress(tensor)
    out = HorovodAllreduce.apply(compressed, average, name, op, prescale_factor,
                                 postscale_factor, process_set)
    return compression.decompress(out, cctx)


# ---------------------------------------------------------------- grouped allreduce

def _grouped_allreduce_async(tensors, inplace, average, name, op, prescale_factor,
                             postscale_factor, process_set, what) -> Handle:
    process_set = check_process_set(process_set)
    op = resolve_op(op, average)
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{what} needs at least one tensor")
    for t in tensors:
        check_tensor(t, what, inplace=inplace)
    if inplace:
        h = _c.grouped_allreduce_async_([_as_array(t) for t in tensors], None, name, op,
                                        prescale_factor, postscale_factor, process_set)
        return Handle(h, lambda _outs: tensors, tensors)
    h = _c.grouped_allreduce_async([_input(t, what) for t in tensors], None, name, op,
                                   prescale_factor, postscale_factor, process_set)
    shapes = [t.shape for t in tensors]
    return Handle(h, lambda outs: [_as_tensor(o).view(s) for o, s in zip(outs, shapes)], tensors)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Starts reducing a list of tensors as one unit (fused together); the
    handle's result is a list of new tensors."""
    return _grouped_allreduce_async(tensors, False, average, name, op, prescale_factor,
                                    postscale_factor, process_set, "grouped_allreduce_async")


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
        if ctx.op not in (Sum, Average):
            raise NotImplementedError("grouped_allreduce is differentiable for Sum and Average "
                                      "only")
        pre, post = ctx.scales
        grads = grouped_allreduce(list(grad_outputs), op=ctx.op, prescale_factor=pre,
                                  postscale_factor=post, process_set=ctx.process_set)
        return (None, None, None, None, None, None, *grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces a list of tensors as one fused unit; returns a list of new
    tensors. Differentiable for Sum and Average."""
    process_set = check_process_set(process_set)
    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                         process_set, *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set) -> Handle:
    """Starts reducing a sparse COO tensor over all ranks (of ``process_set``)
    by gathering every rank's indices and values (as Horovod does);
    ``synchronize(handle)`` or, as in Horovod, ``handle()`` returns the sparse
    sum (Sum) or average (Average, over the set's size), uncoalesced."""
    process_set = check_process_set(process_set)
    op = resolve_op(op)
    if op not in (Sum, Average):
        raise ValueError("sparse_allreduce_async supports op=Sum and op=Average only")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError("sparse_allreduce_async expects a sparse COO tensor")
    if tensor.device.type != "cpu":
        raise ValueError(f"sparse_allreduce_async: tensor is on {tensor.device}; commlib.torch "
                         "supports CPU tensors only")
    t = tensor.coalesce()
    indices = t.indices().t().contiguous()  # allgather concatenates along dimension 0
    values = t.values().contiguous()
    hi = allgather_async(indices, name=None if name is None else f"{name}.indices",
                         process_set=process_set)
    hv = allgather_async(values, name=None if name is None else f"{name}.values",
                         process_set=process_set)
    shape = tuple(tensor.shape)
    n = set_size(process_set)

    def finish(outs):
        idx, val = (_as_tensor(o) for o in outs)
        if op == Average:
            val = val / n
        return torch.sparse_coo_tensor(idx.t(), val, shape, check_invariants=False)

    return CallableHandle([hi._handles, hv._handles], finish, (indices, values))


# ---------------------------------------------------------------- allgather

def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Starts concatenating every rank's ``tensor`` along dimension 0 (whose
    size may differ across ranks; the other dimensions must agree), in the
    order of the ranks (of ``process_set``)."""
    process_set = check_process_set(process_set)
    t = check_tensor(tensor, "allgather_async")
    if t.dim() == 0:
        raise ScalarTensorError("allgather needs a tensor with at least one dimension, "
                                "got a 0-d tensor")
    h = _c.allgather_async(_input(t, "allgather_async"), name, process_set=process_set)
    return Handle(h, _as_tensor, tensor)


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
    process_set = check_process_set(process_set)
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> Handle:
    process_set = check_process_set(process_set)
    tensors = _check_group(tensors, "grouped_allgather")
    base = auto_name("grouped_allgather", name, process_set)
    handles = [allgather_async(t, f"{base}.{i}", process_set) for i, t in enumerate(tensors)]
    return Handle([h._handles for h in handles], lambda outs: [_as_tensor(o) for o in outs],
                  tensors)


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
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ---------------------------------------------------------------- broadcast

def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """Starts copying rank ``root_rank``'s ``tensor`` to every rank (of
    ``process_set``; root_rank is a job rank in it); the result is a new
    tensor (the input is not modified)."""
    process_set = check_process_set(process_set)
    h = _c.broadcast_async(_input(tensor, "broadcast_async"), root_rank, name,
                           process_set=process_set)
    shape = tensor.shape
    return Handle(h, lambda out: _as_tensor(out).view(shape), tensor)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """In-place ``broadcast_async``: ``tensor`` receives root's value."""
    process_set = check_process_set(process_set)
    check_tensor(tensor, "broadcast_async_", inplace=True)
    h = _c.broadcast_async_(_as_array(tensor), root_rank, name, process_set=process_set)
    return Handle(h, lambda _out: tensor, tensor)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


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
        if rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set) -> torch.Tensor:
    """Rank ``root_rank``'s ``tensor``, on every rank (of ``process_set``), as
    a new tensor; differentiable."""
    process_set = check_process_set(process_set)
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


# ---------------------------------------------------------------- alltoall

def _check_group(tensors, what: str) -> list:
    """The list of a grouped collective, checked whole before any is sent."""
    tensors = list(tensors)
    for t in tensors:
        if check_tensor(t, what).dim() == 0:
            raise ScalarTensorError(f"{what} needs tensors with at least one dimension, "
                                    "got a 0-d tensor")
    return tensors


def _split_list(splits, dim0: int, process_set) -> list[int]:
    if splits is None:
        return even_splits(dim0, process_set)
    n = set_size(process_set)
    if isinstance(splits, torch.Tensor):
        if splits.is_floating_point() or splits.dim() != 1:
            raise ValueError("splits must be a 1-D integer tensor, one entry per rank")
        splits = splits.tolist()
    out = [int(s) for s in splits]
    if len(out) != n:
        raise ValueError(f"splits has {len(out)} entries; it needs one per rank ({n})")
    if any(s < 0 for s in out) or sum(out) != dim0:
        raise ValueError(f"splits {out} must be non-negative and sum to dimension 0 ({dim0})")
    return out


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Starts an all-to-all: rows ``splits[i]`` of dimension 0 go to rank i
    (of ``process_set``: its i-th member; an even division when splits is
    None). ``synchronize`` returns ``(output, received_splits)``, as in
    Horovod."""
    process_set = check_process_set(process_set)
    t = check_tensor(tensor, "alltoall_async")
    if t.dim() == 0:
        raise ScalarTensorError("alltoall needs a tensor with at least one dimension, "
                                "got a 0-d tensor")
    split_list = _split_list(splits, t.shape[0], process_set)
    h = _c.alltoall_async(_input(t, "alltoall_async"), split_list, name, process_set=process_set)

    def finish(res):
        out, recv = res
        return _as_tensor(out), torch.from_numpy(recv.astype(np.int32))

    return Handle(h, finish, tensor)


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
    process_set = check_process_set(process_set)
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# ---------------------------------------------------------------- reducescatter

def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    """Starts reducing ``tensor`` over all ranks (of ``process_set``), leaving
    on each rank its part of dimension 0 (part i on the set's i-th member;
    lower positions get the extra rows)."""
    process_set = check_process_set(process_set)
    op = resolve_op(op)
    t = check_tensor(tensor, "reducescatter_async")
    if t.dim() == 0:
        raise ScalarTensorError("reducescatter needs a tensor with at least one dimension, "
                                "got a 0-d tensor")
    h = _c.reducescatter_async(_input(t, "reducescatter_async"), op, name, prescale_factor,
                               postscale_factor, process_set=process_set)
    return Handle(h, _as_tensor, tensor)


class HorovodReducescatter(torch.autograd.Function):
    """reducescatter as an autograd function: the gradient is the allgather
    of the output gradients (over the same process set), times the scale
    factors (and 1/size of the set for Average)."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op = op = resolve_op(op)
        ctx.scale = prescale_factor * postscale_factor
        ctx.process_set = process_set
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.op not in (Sum, Average):
            raise NotImplementedError("reducescatter is differentiable for Sum and Average only")
        grad = allgather(grad_output.contiguous(), process_set=ctx.process_set)
        scale = ctx.scale / (set_size(ctx.process_set) if ctx.op == Average else 1)
        return grad * scale, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0,
                  postscale_factor=1.0) -> torch.Tensor:
    """This rank's part of the reduction of ``tensor`` over all ranks (of
    ``process_set``); differentiable for Sum and Average."""
    process_set = check_process_set(process_set)
    compressed, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                     postscale_factor)
    return compression.decompress(out, cctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    process_set = check_process_set(process_set)
    tensors = _check_group(tensors, "grouped_reducescatter")
    base = auto_name("grouped_reducescatter", name, process_set)
    handles = [reducescatter_async(t, f"{base}.{i}", op, process_set, prescale_factor,
                                   postscale_factor) for i, t in enumerate(tensors)]
    return Handle([h._handles for h in handles], lambda outs: [_as_tensor(o) for o in outs],
                  tensors)


class HorovodGroupedReducescatter(torch.autograd.Function):
    """grouped_reducescatter as an autograd function: as for reducescatter,
    the gradients are the allgather of the output gradients (one grouped
    allgather), times the scale factors and 1/size of the set for Average."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op = op = resolve_op(op)
        ctx.scale = prescale_factor * postscale_factor
        ctx.process_set = process_set
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set,
                                                             prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        if ctx.op not in (Sum, Average):
            raise NotImplementedError("grouped_reducescatter is differentiable for Sum and "
                                      "Average only")
        grads = synchronize(grouped_allgather_async([g.contiguous() for g in grad_outputs],
                                                    process_set=ctx.process_set))
        scale = ctx.scale / (set_size(ctx.process_set) if ctx.op == Average else 1)
        return (None, None, None, None, None, *[g * scale for g in grads])


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor of a list, negotiated as one group;
    differentiable for Sum and Average (as reducescatter)."""
    process_set = check_process_set(process_set)
    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                             postscale_factor, *[p[0] for p in pairs])
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


# ---------------------------------------------------------------- barrier, join

def barrier(process_set=global_process_set) -> None:
    """Returns once every rank (of ``process_set``) has called barrier()."""
    _c.barrier(process_set=check_process_set(process_set))


def join(device=-1) -> int:
    """This rank has no more batches: until every rank has called join(), it
    takes part in the other ranks' collectives (contributing zeros to
    allreduce, so DistributedOptimizer's Average divides the others' sum by
    the number of ranks; no rows to allgather; receiving broadcasts). Returns
    the rank that called join() last, the same on every rank. ``device`` is
    accepted for compatibility; only -1 (CPU) is meaningful."""
    return _c.join()


__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
    "cross_size", "cross_rank", "mpi_threads_supported", "mpi_enabled", "mpi_built",
    "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
    "rocm_built", "is_homogeneous", "Sum", "Average", "Min", "Max", "Product", "Adasum",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "Handle", "poll",
    "synchronize",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
    "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
    "grouped_reducescatter", "grouped_reducescatter_async", "barrier", "join", "CommlibError",
    "sparse_allreduce_async", "start_timeline", "stop_timeline",
]

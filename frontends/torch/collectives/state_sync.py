"""Model-level helpers: broadcast parameters, optimizer state and arbitrary
Python objects from one rank to all, gather objects from all ranks. Each takes
``process_set`` (as Horovod's broadcast_object/allgather_object do; a
commlib extension for broadcast_parameters/broadcast_optimizer_state): then
only the set's members call it, and ``root_rank`` is a job rank in the set."""
from __future__ import annotations

import torch

from commlib import objects as _objects
from commlib.process_sets import check_process_set

from ..mpi_ops import SUPPORTED_DTYPES, broadcast_async_, global_process_set, rank, synchronize


def broadcast_parameters(params, root_rank, prefix=None, process_set=global_process_set):
    """Copies parameters (or any tensors) of rank ``root_rank`` into the same
    tensors on every other rank, in place. Typical use::

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    ``params`` is a dict of name -> tensor (``state_dict()``), or a list of
    tensors or of (name, tensor) pairs (``list(model.named_parameters())``);
    any other iterable of those is accepted too. Every rank must pass the same
    names, shapes and dtypes. ``prefix`` is prepended to the collective names
    (Horovod accepts it too). With ``process_set``, only its members call it
    and receive root's values."""
    process_set = check_process_set(process_set)
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, torch.Tensor):
        raise ValueError("broadcast_parameters takes a dict or list of tensors, not one tensor; "
                         "use broadcast_ for a single tensor")
    else:
        try:
            items = list(params)
        except TypeError:
            raise ValueError(f"invalid params of type: {type(params)}") from None
        items = [p if isinstance(p, tuple) else (None, p) for p in items]
    # Each tensor's broadcast checks its own arguments: one a rank refuses (a
    # root outside the job, a tensor it cannot move) is told to the others
    # (commlib.refusals), and the rest still go, so that no rank waits for a
    # broadcast another will never send; the first error is raised once all
    # are done.
    handles, first_error = [], None
    for name, p in items:
        if name is not None and prefix is not None:
            name = f"{prefix}.{name}"
        try:
            handles.append(broadcast_async_(p, root_rank, name, process_set))
        except (TypeError, ValueError) as e:
            first_error = first_error or e
    for h in handles:
        try:
            synchronize(h)
        except Exception as e:  # noqa: BLE001 - wait for all, then raise the first
            first_error = first_error or e
    if first_error is not None:
        raise first_error


class _TensorSlot:
    """Stands for a tensor in a broadcast state_dict skeleton (``cuda``: root's
    is on a CUDA device, and the others receive it on their current one)."""

    __slots__ = ("index", "shape", "dtype", "cuda")

    def __init__(self, index, shape, dtype, cuda=False):
        self.index, self.shape, self.dtype, self.cuda = index, shape, dtype, cuda

    def empty(self) -> torch.Tensor:
        device = torch.device("cuda", torch.cuda.current_device()) if self.cuda else "cpu"
        return torch.empty(self.shape, dtype=self.dtype, device=device)


def _strip_tensors(obj, tensors: list):
    """obj with every movable tensor replaced by a _TensorSlot (appended to
    ``tensors``); other values are kept for pickling."""
    if isinstance(obj, torch.Tensor):
        if (obj.device.type in ("cpu", "cuda") and obj.layout == torch.strided
                and obj.dtype in SUPPORTED_DTYPES):
            tensors.append(obj.detach().contiguous())
            return _TensorSlot(len(tensors) - 1, tuple(obj.shape), obj.dtype, obj.device.type == "cuda")
        return obj
    if isinstance(obj, dict):
        return type(obj)((k, _strip_tensors(v, tensors)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_strip_tensors(v, tensors) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_strip_tensors(v, tensors) for v in obj)
    return obj


def _fill_tensors(obj, tensors: list):
    if isinstance(obj, _TensorSlot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return type(obj)((k, _fill_tensors(v, tensors)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_fill_tensors(v, tensors) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_fill_tensors(v, tensors) for v in obj)
    return obj


def broadcast_optimizer_state(optimizer, root_rank, prefix="broadcast_optimizer_state",
                              process_set=global_process_set):
    """Makes every rank's optimizer state (per-parameter buffers such as
    momentum, and the param_groups' options such as the learning rate) equal
    to rank ``root_rank``'s. Works for torch optimizers and for
    DistributedOptimizer; every rank must have the same parameters.

    The state_dict's structure and small values travel pickled; its tensors
    travel as tensors (no pickling of large buffers; CUDA ones stay on the
    device, and the engine fuses their broadcasts into few NCCL calls). As in Horovod, an
    optimizer without any state yet (freshly created: no parameter has had a
    gradient) first gets its state from one step with zero gradients
    (``init_state``), so every rank ends with root's initialised state and
    parameters that require a gradient have a zero ``grad`` where they had
    none; unlike Horovod's, that step leaves the parameters unchanged (weight
    decay would move them). State that is each rank's own stays: PowerSGD's
    error buffers. With ``process_set``, only its members call it. (LBFGS,
    whose step needs a closure, is not initialised: a fresh one's empty
    state is what every rank gets; Horovod refuses LBFGS.)"""
    init_state(optimizer)
    broadcast_state(optimizer, root_rank, prefix, process_set)


def broadcast_state(optimizer, root_rank, prefix="broadcast_optimizer_state",
                    process_set=global_process_set):
    """broadcast_optimizer_state without the initialisation: a state that is
    empty on root ends empty everywhere (elastic's sync: a restored run goes
    on exactly as an uninterrupted one)."""
    process_set = check_process_set(process_set)  # (root_rank: broadcast_object checks it, and tells)
    # State that is each rank's own (PowerSGD's error buffers) stays where it is.
    own_state = hasattr(optimizer, "without_own_state")
    state_dict = optimizer.state_dict() if rank() == root_rank else None
    if own_state and state_dict is not None:
        state_dict = optimizer.without_own_state(state_dict)
    tensors: list = []
    skeleton = _strip_tensors(state_dict, tensors) if rank() == root_rank else None
    skeleton = broadcast_object(skeleton, root_rank, name=f"{prefix}.skeleton",
                                process_set=process_set)
    if rank() != root_rank:
        slots = []
        _collect_slots(skeleton, slots)
        slots.sort(key=lambda s: s.index)
        tensors = [s.empty() for s in slots]
    handles = [broadcast_async_(t, root_rank, f"{prefix}.{i}", process_set)
               for i, t in enumerate(tensors)]
    for h in handles:
        synchronize(h)
    if rank() != root_rank:
        received = _fill_tensors(skeleton, tensors)
        optimizer.load_state_dict(optimizer.with_own_state(received) if own_state else received)


def init_state(optimizer) -> None:
    """Horovod's initialisation of a fresh optimizer's state: if it has no
    state at all, one local step (the wrapped optimizer's own, no
    communication) with zero gradients creates it; the parameters are put
    back as they were, and those requiring a gradient keep a zero ``grad``
    where they had none (their other gradients are restored). A ZeRO
    optimizer (sharded state, collective step) and objects that are not torch
    optimizers are left alone."""
    if (not isinstance(optimizer, torch.optim.Optimizer) or optimizer.state
            or getattr(optimizer, "zero_stage", 0) or isinstance(optimizer, torch.optim.LBFGS)):
        return  # (LBFGS: a step needs a closure)
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if not params:
        return
    saved = [(p, p.detach().clone(), p.grad) for p in params]
    # (SparseAdam takes sparse gradients only)
    zeros = _sparse_zeros if isinstance(optimizer, torch.optim.SparseAdam) else torch.zeros_like
    for p in params:
        p.grad = zeros(p)
    try:
        _local_step(optimizer)()
    finally:
        with torch.no_grad():
            for p, data, grad in saved:
                p.copy_(data)
                p.grad = zeros(p) if grad is None else grad


def _sparse_zeros(p):
    return torch.zeros_like(p).to_sparse()


def _local_step(optimizer):
    """The step of the optimizer class that a DistributedOptimizer wraps
    (the optimizer's own step for a plain one)."""
    from ..optim.optimizer import DistributedOptimizerBase

    for cls in type(optimizer).__mro__:
        if "step" in cls.__dict__ and not issubclass(cls, DistributedOptimizerBase):
            return cls.step.__get__(optimizer)
    return optimizer.step


def _collect_slots(obj, out: list):
    if isinstance(obj, _TensorSlot):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect_slots(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect_slots(v, out)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Rank ``root_rank``'s ``obj`` (anything cloudpickle/pickle can
    serialise), on every rank (of ``process_set``). Other ranks' ``obj`` is
    ignored; they may pass None::

        state = hvd.broadcast_object(state if hvd.rank() == 0 else None, 0)
    """
    return _objects.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's ``obj`` (of ``process_set``), as a list in rank order."""
    return _objects.allgather_object(obj, name=name, process_set=process_set)

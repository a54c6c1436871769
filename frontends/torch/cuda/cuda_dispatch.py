"""Where a collective on CUDA tensors runs: ``on_cuda(kind)`` decorates
commlib.torch's asynchronous collectives; CPU tensors go straight to the
decorated function, CUDA tensors either through NCCL in the core
(cuda_nccl) or staged through host memory (cuda_staging), as
commlib.gpu.cuda_path() says (COMMLIB_GPU_BACKEND and what loads; it prints
once which path runs). Reductions NCCL cannot run (16-bit integers, bool,
Average or scale factors on integers, scale factors with Min/Max/Product, Adasum) and
the grouped allgather/reducescatter are staged even when NCCL runs the rest;
a one-time message says so.
"""
from __future__ import annotations

import functools
import inspect
import sys

import torch

from commlib import gpu, runtime
from commlib.ops import auto_name, resolve_op
from commlib.process_sets import check_process_set
from commlib.refusals import refused, refused_members

from . import cuda_nccl
from .cuda_staging import staged_call
from ..collectives.tensor_io import check_tensor, split_list, tensor_list

_noted: set = set()


def _note_once(key: str, message: str) -> None:
    if key not in _noted:
        _noted.add(key)
        print(f"commlib: {message}", file=sys.stderr, flush=True)


def _is_device_tensor(x) -> bool:
    if isinstance(x, (list, tuple)):
        return bool(x) and _is_device_tensor(x[0])
    return isinstance(x, torch.Tensor) and not x.is_cpu  # (is_cpu: cheaper than device.type)


def check_device_tensors(tensors, what: str, inplace: bool) -> None:
    """Every tensor a supported dense CUDA tensor (contiguous when the result
    is written into it), all on one device."""
    group = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    for t in group:
        check_tensor(t, what, inplace=inplace)
    devices = {t.device for t in group}
    if len(devices) > 1 or any(t.device.type == "cpu" for t in group):
        raise ValueError(f"{what}: tensors on several devices ({sorted(map(str, devices))}); "
                         "put a collective's tensors on one device")


def _reducible(tensors, a, op) -> bool:
    group = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    pre, post = a.get("prescale_factor", 1.0), a.get("postscale_factor", 1.0)
    return all(cuda_nccl.can_reduce(t.dtype, op, pre, post) for t in group)


def _nccl_call(kind, a, tensors, inplace):
    """The NCCL form of the call, or None when it must be staged."""
    ps = check_process_set(a["process_set"])
    if kind in ("allreduce", "grouped_allreduce"):
        op = resolve_op(a["op"], a["average"])
        if not _reducible(tensors, a, op):
            return None
        pre, post = a["prescale_factor"], a["postscale_factor"]
        if kind == "allreduce":
            return cuda_nccl.allreduce(tensors, tensors if inplace else None, a["name"], op, pre, post, ps)
        outs = list(tensors) if inplace else [None] * len(tensors)
        return cuda_nccl.grouped_allreduce(tensors, outs, a["name"], op, pre, post, ps)
    if kind == "broadcast":
        return cuda_nccl.broadcast(tensors, tensors if inplace else None, a["root_rank"], a["name"], ps)
    if tensors.dim() == 0:
        return None  # (the staged call raises the CPU path's error)
    if kind == "allgather":
        return cuda_nccl.allgather(tensors, a["name"], ps)
    if kind == "alltoall":
        return cuda_nccl.alltoall(tensors, split_list(a["splits"], tensors.shape[0], ps), a["name"], ps)
    if kind == "reducescatter":
        op = resolve_op(a["op"])
        if not _reducible(tensors, a, op):
            return None
        return cuda_nccl.reducescatter(tensors, a["name"], op, a["prescale_factor"], a["postscale_factor"], ps)
    return None  # grouped allgather / reducescatter: staged


def _route(kind, inplace, fn, sig, args, kwargs):
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    a = dict(bound.arguments)
    first = next(iter(sig.parameters))
    tensors = a[first]
    nccl = gpu.cuda_path() == "nccl"
    mark = runtime.generated
    try:
        check_device_tensors(tensors, fn.__name__, inplace)
        if nccl:
            handle = _nccl_call(kind, a, tensors, inplace)
            if handle is not None:
                return handle
            _note_once(kind, f"{fn.__name__} on CUDA tensors of this kind is staged through host memory "
                             "(NCCL does not run it)")
        return staged_call(lambda staged: fn(**{**a, first: staged}), tensors, inplace,
                           keep_on_host=1 if kind == "alltoall" else None)
    except (TypeError, ValueError) as e:
        _refused(e, kind, a, mark, nccl, tensors)
        raise


def _refused(exc, kind, a, mark, nccl, tensors) -> None:
    """A CUDA call this rank refused (its device checks, NCCL's argument
    checks) told to the others (commlib.refusals; the staged forms and the
    core tell their own). Through NCCL an allgather or alltoall first
    gathers every rank's rows (``<name>.rows``): the others wait there.
    The grouped kinds: ``_refused_group``."""
    if kind.startswith("grouped_"):
        _refused_group(exc, kind, a, mark, nccl, tensors)
        return
    parts = [("allgather", ".rows")] if nccl and kind in ("allgather", "alltoall") else None
    refused(exc, kind, a.get("name"), a.get("process_set"), mark, parts)


def _refused_group(exc, kind, a, mark, nccl, tensors) -> None:
    """A grouped CUDA call refused before it submitted anything, told under
    the names the others' requests have on their path (which depends on it):
    a grouped allreduce through NCCL is one allreduce ``<base>.<i>`` per
    tensor, staged it is one request of the call's name; a grouped
    allgather or reducescatter is always staged, one request ``<base>.<i>``
    per tensor (gather_ops.submit_members). ``base``: the call's name, or
    the one its path generates first."""
    if getattr(exc, "commlib_others_told", False) or runtime.generated != mark:
        return  # (told, or refused after its path generated a name: that path told)
    try:
        ps = check_process_set(a["process_set"])
        count = len(tensors)
    except (TypeError, ValueError):
        return  # (a bad process set: refused on every rank that passes it)
    if kind == "grouped_allreduce":
        through_nccl = nccl and _reducible_as_others(tensors, a)
        if through_nccl is None:
            return  # (a bad op: which path the others take is unknown, and a wrong name would stay)
        if not through_nccl:
            refused(exc, "allreduce", a.get("name"), ps, mark)
            return
        member = "allreduce"
    else:
        member = kind[len("grouped_"):]
    try:
        base = auto_name(kind, a.get("name"), ps)
    except (TypeError, ValueError):
        return  # (a bad name: every rank that passes it refuses it)
    refused_members(exc, member, base, 0, count, ps)


def _reducible_as_others(tensors, a):
    """Whether the others' grouped allreduce runs through NCCL, judged by
    this rank's op, scale factors and the dtypes of those of its tensors
    that pass the checks (the others' must be alike for the call to match
    at all); None when its op is not one."""
    try:
        op = resolve_op(a["op"], a["average"])
    except (TypeError, ValueError):
        return None
    return _reducible([t for t in tensors if _checks_pass(t)], a, op)


def _checks_pass(t) -> bool:
    try:
        check_tensor(t, "grouped_allreduce")
    except (TypeError, ValueError):
        return False
    return True


def on_cuda(kind: str, inplace: bool = False):
    """Decorates an asynchronous collective whose first argument is the
    tensor (or list of tensors): device tensors are routed here."""
    def wrap(fn):
        sig = inspect.signature(fn)
        first = next(iter(sig.parameters))
        group = kind.startswith("grouped_")

        @functools.wraps(fn)
        def run(*args, **kwargs):
            x = args[0] if args else kwargs.get(first)
            if group and not isinstance(x, list):  # (a tuple, any iterable: as a list; a tensor refused)
                x = tensor_list(x, kind)
                args, kwargs = ((x,) + args[1:], kwargs) if args else (args, {**kwargs, first: x})
            if not _is_device_tensor(x):
                return fn(*args, **kwargs)
            return _route(kind, inplace, fn, sig, args, kwargs)
        return run
    return wrap

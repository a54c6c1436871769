"""Collectives on numpy arrays. Names, arguments and defaults follow Horovod.

Every collective but barrier and join (which block) has an ``*_async`` form
returning a Handle; in-place forms end with an underscore. Arguments are checked here, before anything is sent:
unsupported dtypes raise TypeError, bad shapes/roots/outputs ValueError.

Fusion: requests in flight together are fused, up to COMMLIB_FUSION_THRESHOLD
bytes per batch (allgathers and reducescatters up to 4 MiB): allreduces of one
dtype, op and scale factors are reduced in one buffer; on the host allgathers
(any dtypes and shapes) run as one allgather, reducescatters of one dtype, op
and scale factors as one reduce-scatter, broadcasts of one root of at most
64 KiB each as one broadcast. Each request keeps its own result and errors.
Sizes are bounded by memory only: through MPI a collective beyond 1 GiB goes
in pieces.

Dtypes (commlib.dtypes): integer sums and products wrap around as in numpy;
for integers, Average and the scale factors are applied in double precision
and truncated toward zero. float16/bfloat16 are reduced in float32 (through
the ring and the tree they travel as themselves, each step reducing a block
in float32). bool reduces as logical or (Sum, Max) and logical and (Product,
Min).

Process sets: every collective takes ``process_set=`` (default: every rank);
only its members call it (a non-member gets ValueError before anything is
sent). Within a set, allgather/alltoall rows and alltoall splits follow the
set's ranks, reducescatter leaves part i on its i-th member, and broadcast's
``root_rank`` is a job rank in the set.

Adasum (``op=Adasum``; Horovod's adaptive summation, Maleki et al., MLSys
2021): floating-point tensors are combined pairwise along a recursive-doubling
tree: ``a`` (the lower ranks' value) and ``b`` become
``(1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b`` (a coefficient is 1 where the
squared norm is below 1e-8), dot products and norms in float64; equal values
average, orthogonal ones add up. Each tensor of a fused batch keeps its own
coefficients; scale factors apply before and after. Any rank count: with p the
largest power of two below it, ranks 2k and 2k+1 (k < n - p) combine first.
Every rank gets bitwise the same result. Allreduce only (reducescatter raises
ValueError), floating-point dtypes only (TypeError); it runs on the host over
point-to-point messages (CUDA tensors are staged through host memory).
"""
from __future__ import annotations

import numpy as np

from . import runtime
from ._lib import lib
from .checks import check_has_rows, integer, integer_splits
from .dtypes import dtype_code
from .handle import Handle, TakesResult, core_result, core_splits, synchronize, take_for, wait_for
from .process_sets import global_process_set
from .process_sets import members as _members
from .process_sets import process_set_id as _psid
from .process_sets import set_rank, set_size
from .refusals import refused
from .submit import (NULL, again, again_at, array_fields, c_name, cached_facts, describe, quick_repeat,
                     remember_quick, repeat, request, submit, submit_fresh, submit_in_place, submit_remembered)

# Reduction operators (Horovod's names).
Sum = lib.COMMLIB_SUM
Average = lib.COMMLIB_AVERAGE
Min = lib.COMMLIB_MIN
Max = lib.COMMLIB_MAX
Product = lib.COMMLIB_PRODUCT


# Adaptive summation (Maleki et al., MLSys 2021; Horovod's Adasum): allreduce
# only, floating-point tensors only (see this module's docstring).
Adasum = lib.COMMLIB_ADASUM

_OP_NAMES = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Product: "Product",
             Adasum: "Adasum"}
_OP_ALLREDUCE = lib.COMMLIB_OP_ALLREDUCE


ADASUM_DTYPES = ("float16", "bfloat16", "float32", "float64")


def check_adasum_dtype(op, dtype_name: str, what: str) -> None:
    """TypeError, before anything is sent, for op=Adasum on a dtype other
    than float16/bfloat16/float32/float64 (for frontends that check before
    tracing; the core refuses such requests with the same message)."""
    if op == Adasum and dtype_name not in ADASUM_DTYPES:
        raise TypeError(f"{what} with op Adasum needs a floating-point tensor (float16, "
                        f"bfloat16, float32, float64), got {dtype_name}")


def auto_name(kind: str, name=None, process_set=None) -> str:
    """``name`` (checked), or the next ``<kind>.noname.<n>`` of ``process_set``
    (default the global set), for collectives built from several requests
    (the object helpers, the frontends' grouped forms): ranks that make the
    same calls on a set in the same order generate the same names. A set is
    checked (registered, this rank a member) before its counter moves."""
    return runtime.auto_name(kind, name, _psid(process_set) if name is None else 0)


def owned_name(owner, kind: str, process_set=None) -> str:
    """A name for the calls one object repeats on ``process_set`` (a
    layer's, each step): generated as an unnamed call's on that set (its
    counter) the first time ``owner`` asks, then kept until init, shutdown
    or a join start the counters again, so that its repeats hit the
    response cache, which generated names never do. The set's ranks whose
    owners first ask in the same order agree on it. Only for calls that
    never overlap: one name cannot be in flight twice."""
    return runtime.owned_name(owner, kind, _psid(process_set))


def op_name(op: int) -> str:
    """Horovod's name of a reduction op ("Sum", "Average", ...)."""
    return _OP_NAMES.get(op, repr(op))


def as_input(tensor) -> np.ndarray:
    """A C-contiguous array of a supported dtype (copied only if needed)."""
    if type(tensor) is np.ndarray and tensor.flags.c_contiguous:  # the common case, cheaply
        dtype_code(tensor.dtype)
        return tensor
    arr = np.asarray(tensor)
    dtype_code(arr.dtype)
    return np.require(arr, requirements="C")  # keeps 0-d arrays 0-d


def check_output(arr, what: str) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{what} needs a numpy.ndarray to write into, got {type(arr).__name__}")
    dtype_code(arr.dtype)
    flags = arr.flags
    if not flags.c_contiguous:
        raise ValueError(f"{what} needs a C-contiguous array; use numpy.ascontiguousarray() first")
    if not flags.writeable:
        raise ValueError(f"{what} cannot write into a read-only array")
    return arr


def resolve_op(op=None, average=None, default=Average) -> int:
    """The reduction op from Horovod's ``op`` / deprecated ``average`` pair."""
    if average is None and type(op) is int and op in _OP_NAMES:  # the common case, cheaply
        return op
    if average is not None:
        if op is not None:
            raise ValueError("pass either op or the deprecated average argument, not both")
        return Average if average else Sum
    if op is None:
        return default
    if isinstance(op, bool) or op not in _OP_NAMES:
        raise ValueError(f"unsupported reduction op {op!r}; use commlib.Sum/Average/Min/Max/Product/"
                         f"Adasum")
    return op


def _submit(op_type: int, name: str, inp: np.ndarray | None, out: np.ndarray | None,
            **fields) -> int:
    """Submits one request on numpy arrays (see commlib.submit.request for
    ``fields``); returns its handle id."""
    return submit(request(op_type, name, **array_fields(inp, out), **fields))


# ---------------------------------------------------------------- allreduce

def check_result_like(out, inp, what: str) -> np.ndarray:
    """``out`` as a collective's result for input ``inp``: C-contiguous and
    writable (check_output), of its dtype (TypeError) and shape (ValueError),
    the input itself or memory apart from it (ValueError)."""
    out = check_output(out, f"{what} (out=)")
    if out.dtype != inp.dtype:
        raise TypeError(f"{what}: out has dtype {out.dtype}, the input {inp.dtype}")
    if out.shape != inp.shape:
        raise ValueError(f"{what}: out has shape {out.shape}, the input {inp.shape}")
    if (out.size and np.may_share_memory(out, inp)
            and out.__array_interface__["data"][0] != inp.__array_interface__["data"][0]):
        raise ValueError(f"{what}: out overlaps the input without being it (pass the input "
                         f"itself for in place, or separate memory)")
    return out


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None, out=None) -> Handle:
    """Starts reducing ``tensor`` across ranks (of ``process_set``, default
    every rank); the result is a new array, or with ``out`` (C-contiguous,
    writable, the input's dtype and shape) is written there and ``out`` is
    returned."""
    mark = runtime.generated
    try:
        if type(name) is str:  # (a repeated call: checked and built before)
            key = _allreduce_key(name, process_set, op, average, prescale_factor, postscale_factor)
            repeated = _allreduce_again(tensor, key, out)
            if repeated is not None:
                hid, out = repeated
                return Handle(hid, None, (tensor, out), "allreduce", out)
            inp = as_input(tensor)
            if out is not None:  # (repeated into the same out only: its facts end the key)
                out = check_result_like(out, inp, "allreduce")
                key += (describe(out),)
            else:
                out = np.empty_like(inp)
            rop, psid = resolve_op(op, average), _psid(process_set)
            r = request(_OP_ALLREDUCE, c_name("allreduce", name, psid), **array_fields(inp, out), reduce_op=rop,
                        prescale=prescale_factor, postscale=postscale_factor, process_set=psid)
            return Handle(submit_remembered(describe(inp), key, r), None, (inp, out), "allreduce", out)
        inp = as_input(tensor)
        out = np.empty_like(inp) if out is None else check_result_like(out, inp, "allreduce")
        return _allreduce(inp, out, average, name, op, prescale_factor, postscale_factor, process_set)
    except (TypeError, ValueError) as e:
        refused(e, "allreduce", name, process_set, mark)
        raise


def _allreduce_key(name: str, process_set, op, average, prescale, postscale) -> tuple:
    """The key under which a named out-of-place numpy allreduce is repeated
    (into a given out: its facts follow)."""
    return "allreduce", name, _set_key(process_set), op, average, prescale, postscale


def _allreduce_again(tensor, key: tuple, out):
    """A named out-of-place allreduce of a numpy array that repeats the last
    one on it (into the same ``out``, when given: its facts end the key),
    submitted again: ``(handle id, the result array)``; None for any other
    call, nothing submitted."""
    f = cached_facts(tensor, writable=False)
    if out is None:
        last = repeat(f, key)
        if last is None:
            return None
        out = np.empty_like(tensor)
        return again(last, out), out
    fo = cached_facts(out, writable=True)
    last = None if fo is None else repeat(f, key + (fo,))
    return None if last is None else (again(last), out)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None) -> Handle:
    """In-place allreduce: the result is written into ``tensor``."""
    mark = runtime.generated
    try:
        given = _quick_key(name, op, average, prescale_factor, postscale_factor, process_set)
        if given is not None:
            hid = quick_repeat(tensor, given)
            if hid:
                return Handle(hid, None, tensor, "allreduce", tensor)
        f = cached_facts(tensor, writable=True)
        if f is None:
            return _allreduce(check_output(tensor, "allreduce_"), tensor, average, name, op,
                              prescale_factor, postscale_factor, process_set)
        h = allreduce_in_place(f, tensor, name, resolve_op(op, average), prescale_factor,
                               postscale_factor, process_set)
        if given is not None:
            remember_quick(f, given)
        return h
    except (TypeError, ValueError) as e:
        refused(e, "allreduce", name, process_set, mark)
        raise


def _quick_key(name, op, average, prescale, postscale, process_set):
    """The arguments under which an in-place allreduce that repeats the last
    one on its array word for word submits its request again (quick_repeat):
    a given name, the global set, an op that is no bool (False == Sum); None
    for a call that is never repeated so."""
    if type(name) is str and process_set is None and type(op) is not bool:
        return name, op, average, prescale, postscale
    return None


def allreduce_in_place(f, keep, name=None, op=Average, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None, out=None) -> Handle:
    """In-place allreduce of the buffer ``f`` (commlib.submit.Facts: a
    checked array's, or a frontend's checked tensor's) describes, with a
    resolved op. ``keep`` is kept alive until the handle completes and is
    what ``synchronize`` returns. With ``out`` (``(address, result)``: a
    buffer of f's dtype and shape apart from f's, and the object owning it)
    the result is written there instead, and ``synchronize`` returns
    ``result``."""
    psid = _psid(process_set)  # (the global set: 0 at once)
    hid = submit_in_place(f, _OP_ALLREDUCE, "allreduce", name, op, prescale_factor, postscale_factor,
                          psid, None if out is None else out[0])
    if out is None:
        return Handle(hid, None, keep, "allreduce", keep)
    return Handle(hid, None, (keep, out[1]), "allreduce", out[1])


def _handle_or_result(hid: int, keep, result, op: str, wait: bool):
    """The Handle of request ``hid`` (``keep`` alive until it completes, its
    result ``result``), or for a blocking call (``wait``) ``result`` once the
    request completed, without a Handle."""
    if wait:
        wait_for(hid, keep)
        return result
    return Handle(hid, None, keep, op, result)


def allreduce_waited(f, keep, name, op, prescale_factor, postscale_factor, out):
    """``synchronize(allreduce_in_place(...))`` on the global set for a
    blocking call, without a Handle: returns ``out[1]`` (``out`` as
    allreduce_in_place takes it), or ``keep`` when out is None."""
    hid = submit_in_place(f, _OP_ALLREDUCE, "allreduce", name, op, prescale_factor, postscale_factor, 0,
                          None if out is None else out[0])
    if out is None:
        return wait_for(hid, keep)
    return _handle_or_result(hid, (keep, out[1]), out[1], "allreduce", True)


def allreduce_fresh(code: int, shape: tuple, inp, keep, name: str, op, prescale_factor, postscale_factor,
                    out):
    """allreduce_waited for a buffer that is not described (a new tensor each
    call, as a metric's): ``inp`` its address, of dtype ``code`` and
    ``shape``; ``out`` as allreduce_in_place takes it. Returns ``out[1]``."""
    hid = submit_fresh(_OP_ALLREDUCE, "allreduce", name, code, shape, inp, out[0], op, prescale_factor,
                       postscale_factor)
    return _handle_or_result(hid, (keep, out[1]), out[1], "allreduce", True)


def _allreduce(inp, out, average, name, op, prescale, postscale, process_set) -> Handle:
    rop = resolve_op(op, average)
    psid = _psid(process_set)
    hid = _submit(_OP_ALLREDUCE, runtime.auto_name("allreduce", name, psid), inp, out,
                  reduce_op=rop, prescale=prescale, postscale=postscale, process_set=psid)
    return Handle(hid, None, (inp, out), "allreduce", out)


def allreduce(tensor, average=None, name=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None, out=None) -> np.ndarray:
    """The reduction (default Average) of ``tensor`` over all ranks (written
    into ``out`` if given, see allreduce_async)."""
    mark = runtime.generated
    try:
        if type(name) is str:
            repeated = _allreduce_again(tensor, _allreduce_key(name, process_set, op, average, prescale_factor,
                                                              postscale_factor), out)
            if repeated is not None:  # (a repeated call waited for at once: no Handle)
                return wait_for(repeated[0], (tensor, repeated[1]))[1]
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                                           process_set, out))
    except (TypeError, ValueError) as e:
        refused(e, "allreduce", name, process_set, mark)
        raise


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None) -> np.ndarray:
    mark = runtime.generated
    try:
        given = _quick_key(name, op, average, prescale_factor, postscale_factor, process_set)
        hid = 0 if given is None else quick_repeat(tensor, given)
        if hid:  # (a repeated call waited for at once: no Handle)
            return wait_for(hid, tensor)
        return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                                            process_set))
    except (TypeError, ValueError) as e:
        refused(e, "allreduce", name, process_set, mark)
        raise


# ---------------------------------------------------------------- allgather

def allgather_async(tensor, name=None, process_set=None, out=None) -> Handle:
    """Starts concatenating every rank's ``tensor`` along dimension 0 (whose
    size may differ across ranks; the other dimensions must agree). With
    ``out`` (C-contiguous, writable, of the input's dtype and other
    dimensions) the result is written there, with nothing allocated, and
    ``out`` is returned; its rows must equal the sum of every rank's rows
    (else ValueError on that rank). ``tensor`` may be this rank's own part of
    ``out`` (in place: ``allgather(out[lo:hi], out=out)``)."""
    mark = runtime.generated
    try:
        repeated = _allgather_again(tensor, name, process_set, out) if type(name) is str else None
        if repeated is not None:
            hid, finish = repeated
            if out is None:
                return Handle(hid, finish, tensor, "allgather")
            return Handle(hid, None, (tensor, out), "allgather", value=out)
        inp = as_input(tensor)
        check_has_rows(inp.ndim, "allgather")
        if out is None:
            return allgather_described(describe(inp), inp, name, process_set, array_rows)
        psid = _psid(process_set)
        given = type(name) is str
        name = runtime.auto_name("allgather", name, psid)
        what = f"allgather '{name}'"
        out = check_output(out, f"{what} (out=)")
        if out.dtype != inp.dtype:
            raise TypeError(f"{what}: out has dtype {out.dtype}, the input {inp.dtype}")
        if out.ndim != inp.ndim or out.shape[1:] != inp.shape[1:]:
            raise ValueError(f"{what}: out has shape {out.shape}; the result has shape "
                             f"(rows,) + {inp.shape[1:]}")
        r = request(lib.COMMLIB_OP_ALLGATHER, name, **array_fields(inp, out), process_set=psid,
                    output_rows=out.shape[0])
        if not given:
            return Handle(submit(r), None, (inp, out), "allgather", value=out)
        key = ("allgather", psid, name, describe(out))  # (out's facts: the next call's key)
        return Handle(submit_remembered(describe(inp), key, r), None, (inp, out), "allgather", value=out)
    except (TypeError, ValueError) as e:
        refused(e, "allgather", name, process_set, mark)
        raise


def allgather(tensor, name=None, process_set=None, out=None) -> np.ndarray:
    mark = runtime.generated
    try:
        repeated = _allgather_again(tensor, name, process_set, out) if type(name) is str else None
        if repeated is None:
            return synchronize(allgather_async(tensor, name, process_set, out))
        hid, finish = repeated  # (waited for at once: no Handle)
        return take_for(hid, finish.make, tensor) if out is None else wait_for(hid, (tensor, out))[1]
    except (TypeError, ValueError) as e:
        refused(e, "allgather", name, process_set, mark)
        raise


def _allgather_again(tensor, name: str, process_set, out):
    """A named allgather of a numpy array that repeats the last one on it
    (into the same ``out``, when given), submitted again: ``(handle id, its
    finish)`` (None into out); None for any other call, nothing submitted."""
    f = cached_facts(tensor, writable=False)
    if f is None:
        return None
    psid = _psid(process_set)  # (the global set: 0 at once)
    if out is None:
        last = repeat(f, ("allgather", psid, name)) if f.ndim else None
    else:
        fo = cached_facts(out, writable=True)
        last = None if fo is None else repeat(f, ("allgather", psid, name, fo))
    return None if last is None else (again(last), last[2])


def allgather_described(f, keep, name, process_set, rows_view, wait: bool = False):
    """allgather of the buffer ``f`` (commlib.submit.Facts) describes: a
    checked array's, or a frontend's checked tensor's of at least one
    dimension. The handle keeps ``keep`` alive; its result is
    ``view(data, rows)`` where ``view = rows_view(f)`` (data: the result's
    bytes, now owned by Python; rows: its dimension 0). With a given name, a
    call that repeats the last one on f's buffer (the same name and set)
    submits its request again. ``wait``: a blocking call's, which returns
    the result itself (no Handle)."""
    psid = _psid(process_set)  # (the global set: 0 at once)
    key = ("allgather", psid, name) if type(name) is str else None
    last = None if key is None else repeat(f, key)
    if last is not None:
        if wait:
            return take_for(again(last), last[2].make, keep)
        return Handle(again(last), last[2], keep, "allgather")
    r = request(lib.COMMLIB_OP_ALLGATHER, c_name("allgather", name, psid), dtype=f.code, ndim=f.ndim,
                shape=f.cshape, input=f.ptr, process_set=psid)
    finish = TakesResult(rows_view(f))
    hid = submit(r) if key is None else submit_remembered(f, key, r, finish)
    return take_for(hid, finish.make, keep) if wait else Handle(hid, finish, keep, "allgather")


def allgather_fresh(code: int, shape: tuple, inp, keep, name: str, view):
    """A blocking allgather on the global set of a buffer that is not
    described (a new tensor each call, as a metric's): ``inp`` its address,
    of dtype ``code`` and ``shape`` (at least one dimension); returns
    ``view(data, rows)`` of the result (see allgather_described)."""
    hid = submit_fresh(lib.COMMLIB_OP_ALLGATHER, "allgather", name, code, shape, inp, NULL, 0, 1.0, 1.0)
    return take_for(hid, view, keep)


def array_rows(f):
    """allgather_described's rows_view for a numpy array's facts: its
    result as an array of the input's dtype and trailing dimensions."""
    dtype, trailing = f.dtype, f.shape[1:]
    if not trailing:
        return lambda data, rows: np.frombuffer(data, dtype=dtype)
    return lambda data, rows: np.frombuffer(data, dtype=dtype).reshape((rows,) + trailing)


def _set_key(process_set):
    """process_set as part of a repeated call's key (the global set: 0): the
    set with its current id, so that a call after the set was removed, or
    removed and added again (a new id), is checked and built afresh rather
    than submitted again with the id it had."""
    if process_set is None or process_set is global_process_set:
        return 0
    return process_set, getattr(process_set, "process_set_id", None)


# ---------------------------------------------------------------- broadcast

def check_root(root_rank, process_set=None) -> int:
    """broadcast's root check (TypeError/ValueError), also for frontends that
    check before tracing or sending: an int, a rank of the job, a member of
    ``process_set`` when one is given (root_rank is a job rank, as in
    Horovod)."""
    root_rank = integer(root_rank, "root_rank")
    n = runtime.size()
    if not 0 <= root_rank < n:
        raise ValueError(f"root_rank {root_rank} is outside the job (ranks 0..{n - 1})")
    if process_set is not None and root_rank not in _members(process_set):
        raise ValueError(f"root_rank {root_rank} is not a member of {process_set}")
    return root_rank


def broadcast_async(tensor, root_rank, name=None, process_set=None) -> Handle:
    """Starts copying ``tensor`` of rank ``root_rank`` to every rank (of
    ``process_set``; root_rank is a job rank in it); the result is a new
    array."""
    mark = runtime.generated
    try:
        if type(name) is str:  # (a repeated call: checked and built before)
            f = cached_facts(tensor, writable=False)
            last = repeat(f, ("broadcast", name, _set_key(process_set), root_rank))
            if last is not None:
                out = np.empty_like(tensor)
                return Handle(again(last, out), None, (tensor, out), "broadcast", out)
        inp = as_input(tensor)
        return _broadcast(inp, np.empty_like(inp), root_rank, name, process_set)
    except (TypeError, ValueError) as e:
        refused(e, "broadcast", name, process_set, mark)
        raise


def broadcast_async_(tensor, root_rank, name=None, process_set=None) -> Handle:
    mark = runtime.generated
    try:
        return broadcast_in_place(_written_facts(tensor), tensor, root_rank, name, process_set)
    except (TypeError, ValueError) as e:
        refused(e, "broadcast", name, process_set, mark)
        raise


def _written_facts(tensor):
    """The facts of an array broadcast_ writes into: cached, or checked."""
    f = cached_facts(tensor, writable=True)
    return f if f is not None else describe(check_output(tensor, "broadcast_"))


def broadcast_in_place(f, keep, root_rank, name=None, process_set=None, out=None, wait: bool = False):
    """In-place broadcast of the buffer ``f`` (commlib.submit.Facts: a
    checked array's, or a frontend's checked tensor's) describes. ``keep`` is
    kept alive until the handle completes and is what ``synchronize``
    returns. With ``out`` (``(address, result)``: a buffer of f's dtype and
    shape apart from f's, and the object owning it) the root's value goes
    there instead, and ``synchronize`` returns ``result``. A named call that
    repeats the last one on ``f`` submits its request again. ``wait``: a
    blocking call's, which returns that result itself (no Handle)."""
    key = ("broadcast_" if out is None else "broadcast", name, _set_key(process_set), root_rank)
    last = repeat(f, key) if type(name) is str else None
    if last is not None:
        hid = again(last) if out is None else again_at(last, out[0])
    else:
        psid = _psid(process_set)
        r = request(lib.COMMLIB_OP_BROADCAST, c_name("broadcast", name, psid), dtype=f.code, ndim=f.ndim,
                    shape=f.cshape, input=f.ptr, output=f.ptr if out is None else out[0],
                    root=check_root(root_rank, process_set), process_set=psid)
        hid = submit_remembered(f, key, r) if type(name) is str else submit(r)
    if out is None:
        return _handle_or_result(hid, keep, keep, "broadcast", wait)
    return _handle_or_result(hid, (keep, out[1]), out[1], "broadcast", wait)


def _broadcast(inp, out, root_rank, name, process_set) -> Handle:
    psid = _psid(process_set)
    root = check_root(root_rank, process_set)
    if type(name) is str:
        r = request(lib.COMMLIB_OP_BROADCAST, c_name("broadcast", name, psid), **array_fields(inp, out),
                    root=root, process_set=psid)
        hid = submit_remembered(describe(inp), ("broadcast", name, _set_key(process_set), root_rank), r)
        return Handle(hid, None, (inp, out), "broadcast", out)
    hid = _submit(lib.COMMLIB_OP_BROADCAST, runtime.auto_name("broadcast", name, psid), inp, out,
                  root=root, process_set=psid)
    return Handle(hid, None, (inp, out), "broadcast", out)


def broadcast(tensor, root_rank, name=None, process_set=None) -> np.ndarray:
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=None) -> np.ndarray:
    mark = runtime.generated
    try:
        return broadcast_in_place(_written_facts(tensor), tensor, root_rank, name, process_set,
                                  wait=True)  # (waited for at once: no Handle)
    except (TypeError, ValueError) as e:
        refused(e, "broadcast", name, process_set, mark)
        raise


# ---------------------------------------------------------------- alltoall

def alltoall_async(tensor, splits=None, name=None, process_set=None) -> Handle:
    """Starts an all-to-all: rows ``splits[i]`` of dimension 0 go to rank i
    (of ``process_set``: its i-th member) (equal parts when splits is None). The result is the received rows in rank
    order, and, when splits is given, the rows received from each rank."""
    mark = runtime.generated
    try:
        key = _alltoall_key(name, splits, process_set)
        if key is not None:
            last = repeat(cached_facts(tensor, writable=False), key)  # (a repeated call: checked and built before)
            if last is not None:
                return Handle(again(last), last[2], tensor, "alltoall")
        inp = as_input(tensor)
        check_has_rows(inp.ndim, "alltoall")
        split_list = None
        if splits is not None:
            split_list = integer_splits(splits)
        psid = _psid(process_set)
        n = len(_members(process_set))
        if split_list is not None and len(split_list) != n:
            raise ValueError(f"alltoall splits must have one entry per rank ({n}), got {len(split_list)}")
        rows = array_rows(describe(inp))
        if split_list is None:
            finish = TakesResult(rows)
        else:
            def finish(h):
                return rows(*core_result(h)), np.asarray(core_splits(h, n), dtype=np.int64)

        r = request(lib.COMMLIB_OP_ALLTOALL, c_name("alltoall", name, psid), **array_fields(inp, None),
                    splits=split_list, process_set=psid)
        hid = submit(r) if key is None else submit_remembered(describe(inp), key, r, finish)
        return Handle(hid, finish, inp, "alltoall")
    except (TypeError, ValueError) as e:
        refused(e, "alltoall", name, process_set, mark)
        raise


def alltoall_described(f, keep, splits, name, process_set, make_result) -> Handle:
    """alltoall of the buffer ``f`` (commlib.submit.Facts) describes (a
    frontend's checked tensor's of at least one dimension), rows
    ``splits[i]`` to the set's i-th member (a checked list; None: equal
    parts). The handle keeps ``keep`` alive; its result is
    ``result(data, rows, received)`` where ``result = make_result(f)`` (data:
    the received rows' bytes, now owned by Python; rows: their number;
    received: the rows from each member). A named call that repeats the last
    one on f's buffer submits its request again."""
    psid = _psid(process_set)  # (the global set: 0 at once)
    key = None
    if type(name) is str:
        key = ("alltoall", name, psid, None if splits is None else tuple(splits))
        last = repeat(f, key)
        if last is not None:
            return Handle(again(last), last[2], keep, "alltoall")
    send = even_splits(f.shape[0], process_set) if splits is None else splits
    n, result = len(send), make_result(f)

    def finish(hid):
        return result(*core_result(hid), core_splits(hid, n))

    r = request(lib.COMMLIB_OP_ALLTOALL, c_name("alltoall", name, psid), dtype=f.code, ndim=f.ndim,
                shape=f.cshape, input=f.ptr, splits=send, process_set=psid)
    hid = submit(r) if key is None else submit_remembered(f, key, r, finish)
    return Handle(hid, finish, keep, "alltoall")


def alltoall_rows(f, keep, name: str, process_set, rows_view):
    """A blocking named alltoall in equal parts (no splits) of the buffer
    ``f`` (commlib.submit.Facts) describes (a frontend's checked tensor's of
    at least one dimension), returning only the received rows,
    ``view(data, rows)`` where ``view = rows_view(f)`` (as
    allgather_described's): no Handle, no received splits. A call that
    repeats the last one on f's buffer submits its request again."""
    psid = _psid(process_set)
    key = ("alltoall.rows", name, psid)
    last = repeat(f, key)
    if last is not None:
        return take_for(again(last), last[2].make, keep)
    r = request(lib.COMMLIB_OP_ALLTOALL, c_name("alltoall", name, psid), dtype=f.code, ndim=f.ndim,
                shape=f.cshape, input=f.ptr, splits=even_splits(f.shape[0], process_set), process_set=psid)
    finish = TakesResult(rows_view(f))
    return take_for(submit_remembered(f, key, r, finish), finish.make, keep)


def even_splits(rows: int, process_set=None) -> list[int]:
    """alltoall's splits when none are given: dimension 0 in equal parts,
    one per rank (of ``process_set``)."""
    n = set_size(process_set)
    if rows % n:
        raise ValueError(f"alltoall without splits needs dimension 0 ({rows}) divisible by the "
                         f"number of ranks ({n}); pass splits for an uneven division")
    return [rows // n] * n


def _alltoall_key(name, splits, process_set):
    """The key under which a named numpy alltoall is repeated (None: an
    unnamed one, or splits of another type, is checked again each call)."""
    if type(name) is str and (splits is None or type(splits) in (list, tuple)):
        return "alltoall", name, _set_key(process_set), None if splits is None else tuple(splits)
    return None


def alltoall(tensor, splits=None, name=None, process_set=None):
    mark = runtime.generated
    try:
        key = _alltoall_key(name, splits, process_set) if splits is None else None
        last = None if key is None else repeat(cached_facts(tensor, writable=False), key)
        if last is not None:  # (a repeated call waited for at once: no Handle)
            return take_for(again(last), last[2].make, tensor)
        return synchronize(alltoall_async(tensor, splits, name, process_set))
    except (TypeError, ValueError) as e:
        refused(e, "alltoall", name, process_set, mark)
        raise


# ---------------------------------------------------------------- reducescatter

def reducescatter_rows(dim0: int, process_set=None) -> int:
    """The rows of dimension 0 that reducescatter leaves on this rank: the
    set's members split them in order, lower positions get the extra rows.
    ValueError when this rank is not a member."""
    n, pos = set_size(process_set), set_rank(process_set)
    return dim0 // n + (1 if pos < dim0 % n else 0)


def reducescatter_async(tensor, op=Average, name=None, prescale_factor=1.0,
                        postscale_factor=1.0, process_set=None, out=None, splits=None) -> Handle:
    """Starts reducing ``tensor`` across ranks and leaves on each rank its part
    of dimension 0 (split as evenly as possible, lower ranks get the extra
    rows; or ``splits[i]`` rows for the set's i-th rank, the same list on
    every rank, summing to dimension 0). ``out``: a C-contiguous writable
    array of that part's shape and the input's dtype to write the result
    into (no allocation); it is the result."""
    mark = runtime.generated
    try:
        key = None
        if type(name) is str and (splits is None or type(splits) in (list, tuple)):
            # (a repeated call: checked and built before; a given out is the same array as then)
            f = cached_facts(tensor, writable=False)
            fo = None if out is None else cached_facts(out, writable=True)
            key = ("reducescatter", name, _set_key(process_set), op, prescale_factor, postscale_factor,
                   None if splits is None else tuple(splits), fo)
            last = repeat(f, key) if out is None or fo is not None else None
            if last is not None:
                if out is not None:
                    return Handle(again(last), None, (tensor, out), "reducescatter", out)
                out = np.empty(last[2], dtype=tensor.dtype)
                return Handle(again(last, out), None, (tensor, out), "reducescatter", out)
        inp = as_input(tensor)
        check_has_rows(inp.ndim, "reducescatter")
        psid = _psid(process_set)
        if splits is None:
            rows = reducescatter_rows(inp.shape[0], process_set)
        else:
            splits = integer_splits(splits)
            pos, n = set_rank(process_set), set_size(process_set)
            if len(splits) != n or min(splits, default=0) < 0 or sum(splits) != inp.shape[0]:
                raise ValueError(f"reducescatter splits {splits}: expected {n} non-negative "
                                 f"entries summing to dimension 0 ({inp.shape[0]})")
            rows = splits[pos]
        shape = (rows,) + inp.shape[1:]
        if out is None:
            out = np.empty(shape, dtype=inp.dtype)
        else:
            check_out_part(out, shape, inp.dtype, "reducescatter")
            if np.may_share_memory(out, inp):
                raise ValueError("reducescatter: out must not overlap the input")
            if key is not None:  # (its facts, for the next identical call's key)
                key = key[:-1] + (describe(out),)
        r = request(lib.COMMLIB_OP_REDUCESCATTER, c_name("reducescatter", name, psid), **array_fields(inp, out),
                    reduce_op=resolve_op(op), prescale=prescale_factor, postscale=postscale_factor,
                    splits=splits, process_set=psid)
        hid = submit(r) if key is None else submit_remembered(describe(inp), key, r, shape)
        return Handle(hid, None, (inp, out), "reducescatter", out)
    except (TypeError, ValueError) as e:
        refused(e, "reducescatter", name, process_set, mark)
        raise


def reducescatter(tensor, op=Average, name=None, prescale_factor=1.0,
                  postscale_factor=1.0, process_set=None, out=None, splits=None) -> np.ndarray:
    if out is None and splits is None and type(name) is str:
        # (a named call repeating the last one on its array, waited for at once: no Handle)
        key = ("reducescatter", name, _set_key(process_set), op, prescale_factor, postscale_factor, None, None)
        last = repeat(cached_facts(tensor, writable=False), key)
        if last is not None:
            out = np.empty(last[2], dtype=tensor.dtype)
            return wait_for(again(last, out), (tensor, out))[1]
    return synchronize(reducescatter_async(tensor, op, name, prescale_factor, postscale_factor,
                                           process_set, out, splits))


def reducescatter_described(f, keep, name, op, prescale_factor, postscale_factor, process_set,
                            new_out, wait: bool = False):
    """reducescatter of the buffer ``f`` (commlib.submit.Facts) describes: a
    frontend's checked tensor's of at least one dimension, split as
    reducescatter_async splits without splits. ``new_out(shape, f)`` makes
    the result: ``(address, result)``, a new buffer of this rank's part's
    shape and f's dtype, and the object owning it, which ``synchronize``
    returns. A named call that repeats the last one on f's buffer submits its
    request again, into the new result. ``wait``: a blocking call's, which
    returns the result itself (no Handle)."""
    psid = _psid(process_set)  # (the global set: 0 at once)
    key = None
    if type(name) is str:
        key = ("reducescatter", name, psid, op, prescale_factor, postscale_factor)
        last = repeat(f, key)
        if last is not None:
            address, result = new_out(last[2], f)
            return _handle_or_result(again_at(last, address), (keep, result), result, "reducescatter", wait)
    shape = (reducescatter_rows(f.shape[0], process_set),) + f.shape[1:]
    address, result = new_out(shape, f)
    r = request(lib.COMMLIB_OP_REDUCESCATTER, c_name("reducescatter", name, psid), dtype=f.code,
                ndim=f.ndim, shape=f.cshape, input=f.ptr, output=address, reduce_op=resolve_op(op),
                prescale=prescale_factor, postscale=postscale_factor, process_set=psid)
    hid = submit(r) if key is None else submit_remembered(f, key, r, shape)
    return _handle_or_result(hid, (keep, result), result, "reducescatter", wait)


def check_out_part(out, shape: tuple, dtype, what: str) -> np.ndarray:
    """ValueError/TypeError unless ``out`` can take a result of ``shape`` and ``dtype``."""
    check_output(out, f"{what} (out=)")
    if out.dtype != dtype:
        raise TypeError(f"{what}: out has dtype {out.dtype}, the input {dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{what}: out has shape {tuple(out.shape)}; this rank's part has "
                         f"shape {tuple(shape)}")
    return out


# ---------------------------------------------------------------- barrier, join

def barrier(process_set=None) -> None:
    """Returns once every rank (of ``process_set``) has called barrier()."""
    psid = _psid(process_set)
    hid = _submit(lib.COMMLIB_OP_BARRIER, runtime.auto_name("barrier", None, psid), None, None,
                  process_set=psid)
    synchronize(Handle(hid, None, None, "barrier"))


def join(device: int = -1) -> int:
    """This rank has no more collectives to submit (for instance: it ran out
    of data first). Until every rank has called join(), it takes part in the
    other ranks' collectives of the job: it contributes zeros to allreduce
    and reducescatter (an ``Average`` still divides by the number of ranks),
    no rows to allgather and alltoall, receives broadcasts (a joined rank
    cannot be a broadcast's root), and passes barriers. Returns, on every
    rank, the rank that called join() last. Generated names (``name=None``)
    start again after it, the same on every rank.

    ``device``: the CUDA device on which this rank stands in for the others'
    CUDA collectives (by default the device of its own CUDA collectives; -1:
    none given)."""
    device = -1 if device is None else integer(device, "join's device")
    cuda = {"device_type": lib.COMMLIB_DEVICE_CUDA, "device_id": device} if device >= 0 else {}
    hid = _submit(lib.COMMLIB_OP_JOIN, f"commlib.join.{runtime.name_epoch()}", None, None, **cuda)
    last = synchronize(Handle(hid, lambda h: core_splits(h, 1)[0], None, "join"))
    runtime.names_after_join()
    return int(last)

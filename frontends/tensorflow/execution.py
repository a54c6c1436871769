"""How commlib.tensorflow runs a collective: eagerly, or inside tf.function
as one ordered ``tf.numpy_function`` op named from the graph (see collectives for
the rules that keep ranks in step); how generated names stay in step across
ranks after errors; its errors as TensorFlow's (see errors); the dtypes it
accepts, and how dtypes the core cannot reduce travel as bytes; the time
spent in collectives.
"""
from __future__ import annotations

import contextlib
import re
import threading
import time
import weakref

import numpy as np
import tensorflow as tf

from commlib.dtypes import SUPPORTED as _CORE_DTYPE_NAMES
from commlib import runtime
from commlib.errors import CommlibError
from commlib.ops import auto_name, check_adasum_dtype
from commlib.refusals import refused

from . import errors

# AutoGraph must not rewrite commlib's own Python (it would recurse into the
# numpy-level calls and run converted code at every step), as it already
# leaves tensorflow and keras alone.
try:
    from tensorflow.python.autograph.core import config as _ag_config

    if not any(rule.matches("commlib") for rule in _ag_config.CONVERSION_RULES):
        _ag_config.CONVERSION_RULES = ((_ag_config.DoNotConvert("commlib"),) +
                                       tuple(_ag_config.CONVERSION_RULES))
except Exception:  # pragma: no cover - internal API moved; do_not_convert below still applies
    pass

# dtypes the core reduces and moves: commlib.dtypes' table, by name
SUPPORTED_DTYPES = tuple(tf.as_dtype(name) for name in _CORE_DTYPE_NAMES)
# fixed-size dtypes the core cannot reduce but data-movement collectives
# (broadcast, allgather, alltoall) can carry as raw bytes
BYTES_DTYPES = (tf.complex64, tf.complex128)


def check_dtype(dtype, what: str, movable: bool = False, op=None) -> None:
    """TypeError unless the core can reduce ``dtype`` (with ``op``: Adasum
    takes floating-point dtypes only) or, when ``movable``, at least move it
    (broadcast, allgather, alltoall)."""
    if dtype in SUPPORTED_DTYPES and op is not None:
        check_adasum_dtype(op, dtype.name, f"commlib.tensorflow.{what}")
    if dtype in SUPPORTED_DTYPES or (movable and dtype in BYTES_DTYPES):
        return
    kinds = ", ".join(d.name for d in SUPPORTED_DTYPES + (BYTES_DTYPES if movable else ()))
    raise TypeError(f"commlib.tensorflow.{what}: unsupported dtype {dtype.name}; "
                    f"supported: {kinds}")


# ------------------------------------------------------------ numpy helpers

def to_bytes(arr: np.ndarray) -> np.ndarray:
    """A rows-preserving uint8 view (dimension 0 kept, the rest as bytes)."""
    arr = np.ascontiguousarray(arr)
    rows = arr.shape[0] if arr.ndim else 1
    rest = int(np.prod(arr.shape[1:], dtype=np.int64)) if arr.ndim else 1
    return arr.reshape(rows, rest).view(np.uint8)


def from_bytes(buf: np.ndarray, dtype, tail: tuple, scalar: bool = False) -> np.ndarray:
    out = np.ascontiguousarray(buf).view(dtype)
    return out.reshape(()) if scalar else out.reshape((buf.shape[0],) + tuple(tail))


def needs_bytes(arr: np.ndarray) -> bool:
    """Whether ``arr`` has a dtype the core cannot carry (sent as bytes)."""
    return arr.dtype.name not in _CORE_DTYPE_NAMES


# ------------------------------------------------------------ graph state, names

class _GraphState:
    __slots__ = ("last_op", "names")

    def __init__(self):
        self.last_op = None
        self.names: dict[tuple[str, int], int] = {}


_graphs: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_NAME_OK = re.compile(r"[^A-Za-z0-9_.\-/]")


def _graph_label(graph) -> str:
    # FuncGraph names are the traced Python function's name, possibly with a
    # numeric uid suffix (branch/body graphs); drop it, it is not stable.
    return re.sub(r"(_\d+)+$", "", getattr(graph, "name", "") or "graph") or "graph"


def _graph_state(graph) -> _GraphState:
    state = _graphs.get(graph)
    if state is None:
        state = _graphs[graph] = _GraphState()
    return state


def _graph_name(graph, default: str, name, ignore_name_scope: bool, process_set=None) -> str:
    """The name of the next op of ``graph`` with default name ``default``
    (or ``name``), counted in the graph's state."""
    state = _graph_state(graph)
    psid = 0 if process_set is None else process_set.process_set_id
    base = _NAME_OK.sub("_", name) if name else default
    scope = "" if ignore_name_scope else graph.get_name_scope()
    full = f"{scope}/{base}" if scope else base
    # Counted per process set: ops of a set that only its members trace do
    # not shift the names of the other sets' ops (names are scoped by set in
    # the core, so the same name on two sets does not collide).
    n = state.names.get((full, psid), 0)
    state.names[(full, psid)] = n + 1
    unique = full if n == 0 else f"{full}_{n}"
    return f"{_graph_label(graph)}/{unique}"


def _check_not_xla(graph) -> None:
    try:
        from tensorflow.python.ops import control_flow_util
        in_xla = control_flow_util.GraphOrParentsInXlaContext(graph)
    except Exception:  # pragma: no cover - internal API moved
        in_xla = False
    if in_xla:
        raise RuntimeError("commlib.tensorflow collectives cannot run inside an XLA-compiled "
                           "function (jit_compile=True); compile the Keras model with "
                           "jit_compile=False or drop jit_compile from tf.function")


# ------------------------------------------------------------ generated names after errors
#
# A collective called without a name gets the next generated name of its kind
# (commlib's counters, shared with the numpy API), so ranks stay in step only
# while each draws the same names. Each op therefore draws exactly once per
# call, before anything in it can fail: eagerly when it is called, in a graph
# at each execution of its op (whose own name comes from the graph: the draw
# keeps the counter where an eager call would leave it, so ranks whose paths
# differ, one through tf.function and another eagerly, stay in step); a
# public call that fails before any of its ops drew (its argument checks,
# eagerly or while being traced) draws its first op's name then. Ranks that
# fail in the same call, wherever in it and however, stay in step.

_draws = threading.local()  # draws made by this thread (a call's own, eagerly or at trace)


def draw_name(kind: str, process_set=None) -> str:
    """The next generated name of ``kind`` (counted per process set)."""
    _draws.n = getattr(_draws, "n", 0) + 1
    return auto_name(kind, None, process_set)


def _raise_as_tf(exc):
    mapped = errors.as_tf_error(exc)
    if mapped is exc:
        raise exc
    raise mapped from exc


class _Call:
    """What a public call's first op will be, for telling the other ranks
    when the call is refused before it (see collective_call); the call's
    body may change it as it learns (a sparse allreduce's first op is the
    allgather of its values, broadcast_variables' one per variable)."""
    __slots__ = ("op", "name", "members")

    def __init__(self, op, name):
        self.op = op  # its default op name ("CommlibBroadcast"); None: tell nothing
        self.name = name  # its own name argument (None: generated)
        self.members = None  # n: the op's names are "<name>.0" .. "<name>.<n-1>"


# Maps collective_call's kinds to commlib.refusals' (the core's request kinds).
_CORE_KINDS = {"grouped_allgather": "allgather", "broadcast_variables": "broadcast"}


@contextlib.contextmanager
def collective_call(kind, name=None, process_set=None, op=None, ignore_name_scope=False):
    """Around a public collective of ``kind`` (its first op's, whose default
    op name is ``op``): if it fails before any of its ops drew a generated
    name, it draws its first op's when it was given no name (kind None: the
    call draws through commlib itself); if it fails before any of its ops
    started (ran eagerly, or was added to the graph being traced), a
    TypeError/ValueError of its own checks (a root outside the job on one
    rank) is told to the other ranks, whose same call then fails at once
    instead of at COMMLIB_TIMEOUT (commlib.refusals; inside tf.function,
    under the name the op has in their graph). commlib's errors leave as
    TensorFlow's. Yields the call's ``_Call``."""
    drawn_before, ops_before = getattr(_draws, "n", 0), getattr(_draws, "ops", 0)
    call = _Call(op, name)
    try:
        yield call
    except BaseException as exc:
        if kind is not None and getattr(_draws, "n", 0) == drawn_before:
            drawn = None
            if name is None:
                try:
                    drawn = draw_name(kind, process_set)
                except Exception:  # noqa: BLE001 - a bad process set: no counter to keep in step
                    pass
            if (call.op is not None and isinstance(exc, (TypeError, ValueError))
                    and getattr(_draws, "ops", 0) == ops_before):
                _tell_refused(exc, _CORE_KINDS.get(kind, kind), call, drawn, process_set,
                              ignore_name_scope)
        if isinstance(exc, CommlibError):
            _raise_as_tf(exc)
        raise


def _tell_refused(exc, kind, call, drawn, process_set, ignore_name_scope) -> None:
    """commlib.refusals.refused for each name the other ranks' first op of
    ``call`` has: eagerly its name (given, or ``drawn``), in a graph the
    name execute gives it there."""
    try:
        if tf.executing_eagerly():
            base = call.name if call.name is not None else drawn
        else:
            base = _graph_name(tf.compat.v1.get_default_graph(), call.op, call.name,
                               ignore_name_scope, process_set)
        if base is None:
            return
        parts = None if call.members is None else [(kind, f".{i}") for i in range(call.members)]
        refused(exc, kind, base, process_set, runtime.generated, parts)
    except Exception:  # noqa: BLE001 - the refusal is raised in any case
        return


# Wall time spent inside collectives (waiting for other ranks included), for
# measuring the communication share of a training step.
_comm = {"seconds": 0.0, "calls": 0}


def communication_stats(reset=False) -> dict:
    """{"seconds", "calls"}: time this process spent in commlib.tensorflow
    collectives (from submission to result, waiting for other ranks
    included) since the start or the last reset."""
    out = dict(_comm)
    if reset:
        _comm["seconds"], _comm["calls"] = 0.0, 0
    return out


def _timed(fn, cname, arrays):
    t0 = time.perf_counter()
    try:
        return list(fn(cname, *arrays))
    finally:
        _comm["seconds"] += time.perf_counter() - t0
        _comm["calls"] += 1


def execute(fn, inputs, touts, default_name: str, name=None, ignore_name_scope=False,
             process_set=None, kind=None):
    """Runs ``fn(collective_name, *numpy_inputs) -> list of numpy outputs``
    eagerly, or as one ordered numpy_function op inside a graph (named from
    the graph, counted per ``process_set``). Without ``name``, each eager call
    and each execution of the graph op first draws the next generated name of
    ``kind`` (see collective_call; eagerly it is the collective's name; kind
    None: ``fn`` draws through commlib itself). commlib's errors leave as
    TensorFlow's (see errors)."""
    draw = kind if name is None else None
    _draws.ops = getattr(_draws, "ops", 0) + 1  # (an op of the call started: see collective_call)
    if tf.executing_eagerly():
        cname = draw_name(draw, process_set) if draw else name
        try:
            outs = _timed(fn, cname, [x.numpy() for x in inputs])
        except CommlibError as exc:
            _raise_as_tf(exc)
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, touts)]
    graph = tf.compat.v1.get_default_graph()
    _check_not_xla(graph)
    state = _graph_state(graph)
    cname = _graph_name(graph, default_name, name, ignore_name_scope, process_set)

    @tf.autograph.experimental.do_not_convert
    def body(*arrays):
        try:
            if draw:
                draw_name(draw, process_set)
            return _timed(fn, cname, arrays)
        except CommlibError as exc:
            raise errors.tagged(exc) from None

    deps = [state.last_op] if state.last_op is not None else []
    with tf.control_dependencies(deps):
        outs = tf.numpy_function(body, list(inputs), list(touts), stateful=True,
                                 name=default_name)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    state.last_op = outs[0].op
    return outs

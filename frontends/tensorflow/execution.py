"""How commlib.tensorflow runs a collective: eagerly, or inside tf.function
as one ordered ``tf.numpy_function`` op named from the graph (see mpi_ops for
the rules that keep ranks in step); the dtypes it accepts, and how dtypes the
core cannot reduce travel as bytes; the time spent in collectives.
"""
from __future__ import annotations

import re
import time
import weakref

import numpy as np
import tensorflow as tf

from commlib.dtypes import SUPPORTED as _CORE_DTYPE_NAMES
from commlib.ops import check_adasum_dtype

# AutoGraph must not rewrite commlib's own Python (it would recurse into the
# numpy-level calls and run converted code at every step), as it already
# leaves tensorflow and keras alone.
try:
    from tensorflow.python.autograph.core import config as _ag_config

    if not any(getattr(rule, "_prefix", None) == "commlib" for rule in _ag_config.CONVERSION_RULES):
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


def _graph_name(graph, state: _GraphState, default: str, name, ignore_name_scope: bool,
                psid: int = 0) -> str:
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
             process_set=None):
    """Runs ``fn(collective_name, *numpy_inputs) -> list of numpy outputs``
    eagerly, or as one ordered numpy_function op inside a graph (named from
    the graph, counted per ``process_set``)."""
    if tf.executing_eagerly():
        outs = _timed(fn, name, [x.numpy() for x in inputs])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, touts)]
    graph = tf.compat.v1.get_default_graph()
    _check_not_xla(graph)
    state = _graphs.get(graph)
    if state is None:
        state = _graphs[graph] = _GraphState()
    psid = 0 if process_set is None else process_set.process_set_id
    cname = _graph_name(graph, state, default_name, name, ignore_name_scope, psid)

    @tf.autograph.experimental.do_not_convert
    def body(*arrays):
        return _timed(fn, cname, arrays)

    deps = [state.last_op] if state.last_op is not None else []
    with tf.control_dependencies(deps):
        outs = tf.numpy_function(body, list(inputs), list(touts), stateful=True,
                                 name=default_name)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    state.last_op = outs[0].op
    return outs

"""Variables and Python objects across ranks (Horovod's
horovod.tensorflow.functions): broadcast_variables, broadcast_object,
broadcast_object_fn, allgather_object. Each takes ``process_set``: then only
the set's members call it, and root_rank is a job rank in the set."""
from __future__ import annotations

import tensorflow as tf

import commlib
from commlib import objects as _objects
from commlib.checks import tensor_group
from commlib.ops import check_root
from commlib.process_sets import check_process_set

from ..execution import (check_dtype, collective_call, draw_name, execute, from_bytes,
                         needs_bytes, to_bytes)


def _broadcast_arrays(arrays, root_rank, base, process_set=None):
    """Broadcasts numpy arrays together (all started, then all awaited);
    dtypes the core cannot carry travel as bytes."""
    handles = []
    for i, x in enumerate(arrays):
        raw = to_bytes(x) if needs_bytes(x) else x
        n = None if base is None else f"{base}.{i}"
        handles.append(commlib.broadcast_async(raw, root_rank, name=n, process_set=process_set))
    outs = []
    for x, h in zip(arrays, handles):
        o = commlib.synchronize(h)
        if needs_bytes(x):
            o = from_bytes(o, x.dtype, x.shape[1:], scalar=x.ndim == 0)
        outs.append(o.reshape(x.shape))
    return outs


def broadcast_variables(variables, root_rank, process_set=None, inplace=False, name=None):
    """Assigns rank ``root_rank``'s values to ``variables`` (tf.Variable or
    Keras variables) on every rank (of ``process_set``). Eagerly it returns
    None once done; inside tf.function it returns the op that does it."""
    name = name or None
    with collective_call("broadcast_variables", name, process_set, "CommlibBroadcastVariables") as call:
        return _broadcast_variables(variables, root_rank, process_set, name, call)


def _broadcast_variables(variables, root_rank, process_set, name, call):
    process_set = check_process_set(process_set)
    variables = tensor_group(variables, "broadcast_variables")  # (one variable: taken as its rows)
    for i, v in enumerate(variables):
        if not hasattr(v, "assign"):
            raise TypeError("broadcast_variables assigns root's values to variables (tf.Variable, "
                            f"Keras variables), got {type(v).__name__} at index {i}")
    call.members = len(variables)  # (one request per variable: "<name>.<i>")
    check_root(root_rank, process_set)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    values = [tf.convert_to_tensor(v) for v in variables]
    for t in values:
        check_dtype(t.dtype, "broadcast_variables", movable=True)
    if tf.executing_eagerly():
        base = name or draw_name("broadcast_variables", process_set)
        outs = _broadcast_arrays([t.numpy() for t in values], root_rank, base, process_set)
        for v, o in zip(variables, outs):
            v.assign(o)
        return None

    def fn(cname, *arrays):
        return _broadcast_arrays(list(arrays), root_rank, cname, process_set)

    outs = execute(fn, values, [t.dtype for t in values], "CommlibBroadcastVariables",
                   name, process_set=process_set, kind="broadcast_variables")
    assigns = []
    for v, o, t in zip(variables, outs, values):
        o.set_shape(t.shape)
        assigns.append(v.assign(o))
    return tf.group(*[a for a in assigns if a is not None])


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """Rank ``root_rank``'s Python object on every rank (pickled; sizes
    first). Eager only, like Horovod's in TF2."""
    with collective_call(None):
        return _objects.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=None):
    """A function ``fn(obj)`` that broadcasts ``obj`` from ``root_rank``."""
    process_set = check_process_set(process_set)

    def _bcast(obj):
        return broadcast_object(obj, root_rank, name=name, process_set=process_set)

    return _bcast


def allgather_object(obj, session=None, name=None, process_set=None):
    """The list of every rank's Python object (of ``process_set``), in rank
    order."""
    with collective_call(None):
        return _objects.allgather_object(obj, name=name, process_set=process_set)

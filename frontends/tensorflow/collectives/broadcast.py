"""broadcast (differentiable) and in-place broadcast_ on tf tensors and variables."""
from __future__ import annotations

import tensorflow as tf

import commlib
from commlib.ops import check_root
from commlib.process_sets import check_process_set

from ..execution import check_dtype, collective_call
from .raw import GRAD_GATHER_OP as _GRAD_GATHER_OP
from .raw import allreduce_raw as _allreduce_raw
from .raw import as_tensor as _as_tensor
from .raw import broadcast_raw as _broadcast_raw
from .raw import dense as _dense
from .raw import records_gradient as _records_gradient

def _broadcast_op(t, root_rank, name, ignore_name_scope, ps):
    if not _records_gradient(t):
        return _broadcast_raw(t, root_rank, name, ignore_name_scope, ps)
    is_root = commlib.rank() == root_rank

    @tf.custom_gradient
    def f(x):
        y = _broadcast_raw(x, root_rank, name, ignore_name_scope, ps)

        def grad(dy):
            total = _allreduce_raw(_dense(dy), _GRAD_GATHER_OP,
                                   ignore_name_scope=ignore_name_scope, process_set=ps)
            return total if is_root else tf.zeros_like(total)

        return y, grad

    return f(t)


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """Rank ``root_rank``'s ``tensor`` on every rank (of ``process_set``;
    root_rank is a job rank in the set)."""
    with collective_call("broadcast", name, process_set, "CommlibBroadcast", ignore_name_scope):
        process_set = check_process_set(process_set)
        check_root(root_rank, process_set)
        t = _as_tensor(tensor)
        check_dtype(t.dtype, "broadcast", movable=True)
        return _broadcast_op(t, root_rank, name, ignore_name_scope, process_set)


def broadcast_(variables, root_rank, name=None, process_set=None):
    """In-place broadcast of ``variables`` (a variable or a list) from
    ``root_rank``; returns their new values."""
    from .state_sync import broadcast_variables

    single = not isinstance(variables, (list, tuple))
    vs = [variables] if single else list(variables)
    op = broadcast_variables(vs, root_rank, process_set=process_set, name=name)
    if tf.executing_eagerly():
        values = [tf.convert_to_tensor(v) for v in vs]
    else:
        with tf.control_dependencies([op]):
            values = [tf.identity(v) for v in vs]
    return values[0] if single else values

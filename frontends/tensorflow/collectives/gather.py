"""allgather, grouped_allgather and alltoall on tf tensors, differentiable."""
from __future__ import annotations

import tensorflow as tf

from commlib.checks import check_has_rows, tensor_group
from commlib.process_sets import check_process_set, set_rank

from ..execution import check_dtype, collective_call
from .raw import GRAD_GATHER_OP as _GRAD_GATHER_OP
from .raw import allgather_raw as _allgather_raw
from .raw import allreduce_raw as _allreduce_raw
from .raw import alltoall_raw as _alltoall_raw
from .raw import as_tensor as _as_tensor
from .raw import dense as _dense
from .raw import differentiable as _differentiable
from .raw import records_gradient as _records_gradient
from .raw import grouped_allgather_raw as _grouped_allgather_raw

def _allgather_grad(x, dy, ignore_name_scope, ps):
    total = _allreduce_raw(_dense(dy), _GRAD_GATHER_OP, ignore_name_scope=ignore_name_scope,
                           process_set=ps)
    sizes = _allgather_raw(tf.shape(x, out_type=tf.int64)[:1], ignore_name_scope=ignore_name_scope,
                           process_set=ps)
    me = set_rank(ps)
    offset = tf.reduce_sum(sizes[:me])
    ndim = tf.rank(x)
    begin = tf.concat([[offset], tf.zeros([ndim - 1], tf.int64)], 0)
    size = tf.concat([sizes[me:me + 1], -tf.ones([ndim - 1], tf.int64)], 0)
    return tf.reshape(tf.slice(total, begin, size), tf.shape(x))


def _allgather_op(t, name, ignore_name_scope, ps):
    if not _records_gradient(t):
        return _allgather_raw(t, name, ignore_name_scope, ps)

    @tf.custom_gradient
    def f(x):
        y = _allgather_raw(x, name, ignore_name_scope, ps)
        return y, lambda dy: _allgather_grad(x, dy, ignore_name_scope, ps)

    return f(t)


def _grouped_allgather_op(ts, name, ignore_name_scope, ps):
    # one op, so that the group draws one generated name eagerly and in graphs alike
    if not _records_gradient(*ts):
        return _grouped_allgather_raw(ts, name, ignore_name_scope, ps)

    @tf.custom_gradient
    def f(*xs):
        ys = _grouped_allgather_raw(list(xs), name, ignore_name_scope, ps)

        def grad(*dys):
            return [_allgather_grad(x, tf.zeros_like(y) if d is None else d, ignore_name_scope, ps)
                    if _differentiable(x) else None for x, y, d in zip(xs, ys, dys)]

        return ys, grad

    return list(f(*ts))


def _alltoall_op(t, splits, name, ignore_name_scope, ps):
    if not _records_gradient(t):
        return _alltoall_raw(t, splits, name, ignore_name_scope, ps)
    rsplits_box = []

    @tf.custom_gradient
    def f(x):
        out, rsplits = _alltoall_raw(x, splits, name, ignore_name_scope, ps)
        rsplits_box.append(rsplits)

        def grad(dy):
            back, _ = _alltoall_raw(_dense(dy), rsplits, ignore_name_scope=ignore_name_scope,
                                    process_set=ps)
            return tf.reshape(back, tf.shape(x))

        return out, grad

    out = f(t)
    return out, rsplits_box[0]


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Concatenates every rank's ``tensor`` (of ``process_set``, in the order
    of its ranks) along dimension 0 (whose size may differ across ranks; the
    other dimensions must agree)."""
    with collective_call("allgather", name, process_set, "CommlibAllgather", ignore_name_scope):
        process_set = check_process_set(process_set)
        t = _as_tensor(tensor)
        check_dtype(t.dtype, "allgather", movable=True)
        return _allgather_op(t, name, ignore_name_scope, process_set)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=None):
    """Allgathers a list of tensors with one op (started together)."""
    with collective_call("grouped_allgather", name, process_set, None, ignore_name_scope) as call:
        process_set = check_process_set(process_set)
        if tensors is not None:  # (None and [] come back as they are, as in Horovod)
            tensors = tensor_group(tensors, "grouped_allgather")
        if not tensors:
            return tensors
        # (its one op's requests: "<name>.<i>", one per tensor)
        call.op, call.members = "CommlibGroupedAllgather", len(tensors)
        ts = [_as_tensor(t) for t in tensors]
        for t in ts:
            check_dtype(t.dtype, "grouped_allgather", movable=True)
            check_has_rows(t.shape.rank, "allgather", several=True)
        return _grouped_allgather_op(ts, name, ignore_name_scope, process_set)


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Sends rows ``splits[i]`` of dimension 0 to rank i (of ``process_set``:
    its i-th member; equal parts when splits is None) and returns the rows
    received, in rank order; with ``splits``, returns ``(output,
    received_splits)`` as Horovod does."""
    with collective_call("alltoall", name, process_set, "CommlibAlltoall", ignore_name_scope):
        process_set = check_process_set(process_set)
        t = _as_tensor(tensor)
        check_dtype(t.dtype, "alltoall", movable=True)
        out, rsplits = _alltoall_op(t, splits, name, ignore_name_scope, process_set)
        return (out, rsplits) if splits is not None else out

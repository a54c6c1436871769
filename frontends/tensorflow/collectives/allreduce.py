"""allreduce and grouped_allreduce on tf tensors (IndexedSlices are
allgathered, as in Horovod), differentiable."""
from __future__ import annotations

import tensorflow as tf

from commlib.checks import scale_factors, tensor_group
from commlib.ops import Adasum, Average, Max, Min, Sum
from commlib.process_sets import check_process_set, set_size
from commlib.reduce_args import resolve_op

from ..compression import Compression
from ..execution import check_dtype, collective_call
from .gather import allgather
from .raw import allreduce_raw as _allreduce_raw
from .raw import as_tensor as _as_tensor
from .raw import dense as _dense
from .raw import differentiable as _differentiable
from .raw import records_gradient as _records_gradient
from .raw import grouped_allreduce_raw

def _allreduce_grad(x, y, dy, op, pre, post, ignore_name_scope, ps):
    dy = _dense(dy)
    if op in (Sum, Average, Adasum):
        return _allreduce_raw(dy, op, pre, post, ignore_name_scope=ignore_name_scope,
                              process_set=ps)
    if op in (Min, Max):
        # the rank(s) holding the extreme get the summed gradient (split among ties)
        scale = tf.cast(pre * post, dy.dtype)
        hit = tf.cast(tf.equal(x * scale, y), dy.dtype)
        ties = _allreduce_raw(hit, Sum, ignore_name_scope=ignore_name_scope, process_set=ps)
        total = _allreduce_raw(dy, Sum, ignore_name_scope=ignore_name_scope, process_set=ps)
        return total * hit * scale / tf.maximum(ties, tf.ones_like(ties))
    raise NotImplementedError("the gradient of a Product allreduce is not implemented")


def _allreduce_op(t, op, pre, post, name, ignore_name_scope, ps):
    if not _records_gradient(t):
        return _allreduce_raw(t, op, pre, post, name, ignore_name_scope, ps)

    @tf.custom_gradient
    def f(x):
        y = _allreduce_raw(x, op, pre, post, name, ignore_name_scope, ps)
        return y, lambda dy: _allreduce_grad(x, y, dy, op, pre, post, ignore_name_scope, ps)

    return f(t)


def _grouped_allreduce_op(ts, op, pre, post, name, ignore_name_scope, ps):
    if (not all(_differentiable(t) for t in ts) or not _records_gradient(*ts)
            or op not in (Sum, Average, Adasum)):
        return grouped_allreduce_raw(ts, op, pre, post, name, ignore_name_scope, ps)

    @tf.custom_gradient
    def f(*xs):
        ys = grouped_allreduce_raw(list(xs), op, pre, post, name, ignore_name_scope, ps)

        def grad(*dys):
            dys = [tf.zeros_like(x) if d is None else tf.cast(_dense(d), x.dtype)
                   for d, x in zip(dys, xs)]
            return grouped_allreduce_raw(dys, op, pre, post, ignore_name_scope=ignore_name_scope,
                                          process_set=ps)

        return ys, grad

    return list(f(*ts))


def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=None, ignore_name_scope=False):
    """Reduces ``tensor`` (tf.Tensor, tf.Variable or tf.IndexedSlices) over all
    ranks (of ``process_set``); ``op`` Average (default; divides by the set's
    size), Sum, Min, Max, Product or Adasum (floating-point tensors). IndexedSlices are allgathered (values and
    indices) instead, as in Horovod. The result has the input's shape and
    dtype (integer Average truncates toward zero)."""
    sparse = isinstance(tensor, tf.IndexedSlices)
    with collective_call("allgather" if sparse else "allreduce", name, process_set,
                         "CommlibAllgather" if sparse else "CommlibAllreduce", ignore_name_scope) as call:
        if sparse:  # (its first op: the allgather of the values)
            call.name = None if name is None else f"{name}.values"
        process_set = check_process_set(process_set)
        op = resolve_op(op, average)
        prescale_factor, postscale_factor = scale_factors(prescale_factor, postscale_factor)
        if sparse:
            if op not in (Sum, Average):
                raise NotImplementedError("Only Sum and Average ops are supported with "
                                          "tf.IndexedSlices")
            return allreduce_sparse(tensor, op, prescale_factor * postscale_factor, name,
                                     ignore_name_scope, process_set)
        t = _as_tensor(tensor)
        check_dtype(t.dtype, "allreduce", op=op)
        with tf.device(device_dense) if device_dense else _nullcontext():
            c, ctx = compression.compress(t)
            r = _allreduce_op(c, op, prescale_factor, postscale_factor, name,
                              ignore_name_scope, process_set)
            return compression.decompress(r, ctx)


def allreduce_sparse(s, op, scale, name, ignore_name_scope, process_set=None):
    check_dtype(s.values.dtype, "allreduce")
    vname = None if name is None else f"{name}.values"
    iname = None if name is None else f"{name}.indices"
    values = allgather(s.values, name=vname, ignore_name_scope=ignore_name_scope,
                       process_set=process_set)
    indices = allgather(s.indices, name=iname, ignore_name_scope=ignore_name_scope,
                        process_set=process_set)
    if op == Average:
        scale = scale / set_size(process_set)
    if scale != 1.0:
        values = values * tf.cast(scale, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=s.dense_shape)


def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, ignore_name_scope=False,
                      name=None):
    """Reduces a list of tensors as one unit (negotiated together and fused);
    IndexedSlices in the list are allgathered. Returns the list of results."""
    if tensors is not None:  # (None and [] come back as they are, as in Horovod)
        tensors = tensor_group(tensors, "grouped_allreduce")  # (a generator read once)
    sparse = [i for i, t in enumerate(tensors or ()) if isinstance(t, tf.IndexedSlices)]
    with collective_call("allgather" if sparse else "allreduce", name, process_set,
                         "CommlibAllgather" if sparse else "CommlibGroupedAllreduce",
                         ignore_name_scope) as call:
        if sparse:  # (its first op: the allgather of the first IndexedSlices' values)
            call.name = None if name is None else f"{name}.sparse{sparse[0]}.values"
        return _grouped_allreduce(tensors, op, average, compression, prescale_factor,
                                  postscale_factor, process_set, ignore_name_scope, name)


def _grouped_allreduce(tensors, op, average, compression, prescale_factor, postscale_factor,
                       process_set, ignore_name_scope, name):
    process_set = check_process_set(process_set)
    if not tensors:
        return tensors
    op = resolve_op(op, average)
    prescale_factor, postscale_factor = scale_factors(prescale_factor, postscale_factor)
    out = [None] * len(tensors)
    dense_idx = []
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            if op not in (Sum, Average):
                raise NotImplementedError("Only Sum and Average ops are supported with "
                                          "tf.IndexedSlices")
            sname = None if name is None else f"{name}.sparse{i}"
            out[i] = allreduce_sparse(t, op, prescale_factor * postscale_factor, sname,
                                       ignore_name_scope, process_set)
        else:
            dense_idx.append(i)
    if dense_idx:
        ts = [_as_tensor(tensors[i]) for i in dense_idx]
        for t in ts:
            check_dtype(t.dtype, "grouped_allreduce", op=op)
        packed = [compression.compress(t) for t in ts]
        reduced = _grouped_allreduce_op([c for c, _ in packed], op, prescale_factor,
                                        postscale_factor, name, ignore_name_scope, process_set)
        for i, r, (_, ctx) in zip(dense_idx, reduced, packed):
            out[i] = compression.decompress(r, ctx)
    return out


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False

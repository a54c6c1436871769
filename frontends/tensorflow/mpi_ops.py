"""Collectives on tf.Tensor / tf.Variable, eagerly and inside tf.function.

Eagerly, a collective converts its input to numpy, calls commlib's numpy API
and converts back; commlib's exceptions (CollectiveMismatchError, TypeError,
...) reach the caller unchanged.

Every collective takes ``process_set`` (None or ``global_process_set``: every
rank; or a ProcessSet registered with add_process_set /
init(process_sets=[...])): only the set's members call it -- a non-member
gets ValueError, at trace time inside tf.function -- Average divides by the
set's size, rows are ordered by the set's ranks, and broadcast's root_rank is
a job rank in the set. Gradients are collectives over the same set.

Inside tf.function each collective becomes one ``tf.numpy_function`` op
(stateful, so it always runs, even when its result is unused) whose output
dtype and static shape are set at trace time (allgather/alltoall: dimension 0
unknown). Two rules keep ranks in step:

* names are fixed at trace time and derived from the graph only: the traced
  function's name, the op's name scope and a per-graph (and per process
  set) counter, so every
  execution of a traced graph uses the same names on every rank, and a
  retrace (e.g. for another batch shape on one rank only) reproduces them;
* within one graph, every commlib op gets a control dependency on the
  previous one, so they execute in program order even with many inter-op
  threads (TF's automatic control dependencies already order stateful ops;
  this makes it explicit).

A collective's commlib error (CollectiveMismatchError, CollectiveTimeoutError,
...) is raised, eagerly and from graph execution alike, as a class deriving
from both it and the tf.errors class Horovod raises (FailedPreconditionError
for ranks that disagree; see ``errors``); other errors inside a graph op
surface as TensorFlow makes them (InvalidArgumentError for
ValueError/TypeError). Bad dtypes are refused with TypeError at trace time,
before anything is sent. Generated names (``name=None``) stay in step across
ranks after any error, eager or graph (see ``execution.collective_call``).

How a collective runs eagerly or as a graph op (names, ordering, dtypes) is
in ``execution``; this module builds Horovod's collectives on it.

Gradients (``tf.custom_gradient``) are the adjoints of the collectives, i.e.
gradients of the sum over ranks of each rank's loss: allreduce -> allreduce of
the upstream gradient with the same op and scale factors (Min/Max: routed to
the rank(s) holding the extreme); allgather -> this rank's rows of the summed
upstream gradient; broadcast -> the summed upstream gradient on the root,
zeros elsewhere (Horovod's original definition; recent Horovod averages
instead of summing for allgather and broadcast: set _GRAD_GATHER_OP below);
alltoall -> alltoall back with the received splits; reducescatter ->
Horovod's: allgather of the upstream gradient times the set's size for Sum
and prescale * postscale for every op.

XLA-compiled functions (jit_compile=True) cannot contain these ops; they are
refused with a clear error at trace time.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

import commlib
from commlib.checks import check_has_rows
from commlib.ops import (Adasum, Average, Max, Min, Product, Sum,  # noqa: F401 - re-exported
                         check_root, even_splits, reducescatter_rows)
from commlib.process_sets import (  # noqa: F401 - re-exported
    check_process_set, global_process_set, included, process_set_by_id, set_rank, set_size)
from commlib.reduce_args import reducescatter_grad_scale, resolve_op

from . import buffers
from .compression import Compression
from .execution import (check_dtype, collective_call, execute, from_bytes, needs_bytes,
                        to_bytes)

# Deliberate: TF sums allgather/broadcast upstream gradients (horovod.torch averages).
_GRAD_GATHER_OP = Sum


def _as_tensor(value):
    return tf.convert_to_tensor(value)


# ------------------------------------------------------------ raw collectives (no gradient)

def _allreduce_raw(t, op, pre=1.0, post=1.0, name=None, ignore_name_scope=False,
                   process_set=None):
    def fn(cname, x):
        (out,) = buffers.outputs.take([x])
        return [commlib.allreduce(x, name=cname, op=op, prescale_factor=pre, postscale_factor=post,
                                  process_set=process_set, out=out)]

    (y,) = execute(fn, [t], [t.dtype], "CommlibAllreduce", name, ignore_name_scope,
                    process_set, kind="allreduce")
    y.set_shape(t.shape)
    return y


def grouped_allreduce_raw(ts, op, pre=1.0, post=1.0, name=None, ignore_name_scope=False,
                           process_set=None):
    def fn(cname, *xs):
        return commlib.grouped_allreduce(list(xs), name=cname, op=op, prescale_factor=pre,
                                         postscale_factor=post, process_set=process_set,
                                         out=buffers.outputs.take(xs))

    ys = execute(fn, ts, [t.dtype for t in ts], "CommlibGroupedAllreduce", name,
                  ignore_name_scope, process_set, kind="allreduce")
    for y, t in zip(ys, ts):
        y.set_shape(t.shape)
    return ys


def _allgather_np(x, cname, process_set=None):
    if needs_bytes(x):
        return from_bytes(commlib.allgather(to_bytes(x), name=cname, process_set=process_set),
                           x.dtype, x.shape[1:])
    return commlib.allgather(x, name=cname, process_set=process_set)


def _allgather_raw(t, name=None, ignore_name_scope=False, process_set=None):
    check_has_rows(t.shape.rank, "allgather")

    def fn(cname, x):
        return [_allgather_np(x, cname, process_set)]

    (y,) = execute(fn, [t], [t.dtype], "CommlibAllgather", name, ignore_name_scope,
                    process_set, kind="allgather")
    if t.shape.rank is not None:
        y.set_shape([None] + t.shape.as_list()[1:])
    return y


def _grouped_allgather_raw(ts, name=None, ignore_name_scope=False, process_set=None):
    def fn(cname, *xs):
        handles = []
        for i, x in enumerate(xs):
            xb = to_bytes(x) if needs_bytes(x) else x
            handles.append(commlib.allgather_async(xb, name=f"{cname}.{i}",
                                                   process_set=process_set))
        outs = [commlib.synchronize(h) for h in handles]
        return [from_bytes(o, x.dtype, x.shape[1:]) if needs_bytes(x) else o
                for o, x in zip(outs, xs)]

    ys = execute(fn, ts, [t.dtype for t in ts], "CommlibGroupedAllgather", name,
                  ignore_name_scope, process_set, kind="grouped_allgather")
    for y, t in zip(ys, ts):
        if t.shape.rank is not None:
            y.set_shape([None] + t.shape.as_list()[1:])
    return ys


def _broadcast_np(x, root_rank, cname, process_set=None):
    if needs_bytes(x):
        out = commlib.broadcast(to_bytes(x), root_rank, name=cname, process_set=process_set)
        return from_bytes(out, x.dtype, x.shape[1:], scalar=x.ndim == 0)
    return commlib.broadcast(x, root_rank, name=cname, process_set=process_set).reshape(x.shape)


def _broadcast_raw(t, root_rank, name=None, ignore_name_scope=False, process_set=None):
    def fn(cname, x):
        return [_broadcast_np(x, root_rank, cname, process_set)]

    (y,) = execute(fn, [t], [t.dtype], "CommlibBroadcast", name, ignore_name_scope,
                    process_set, kind="broadcast")
    y.set_shape(t.shape)
    return y


def _alltoall_raw(t, splits, name=None, ignore_name_scope=False, process_set=None):
    """(output, received_splits as int32)."""
    check_has_rows(t.shape.rank, "alltoall")
    inputs = [t]
    if splits is not None:
        inputs.append(tf.cast(tf.convert_to_tensor(splits), tf.int64))

    def fn(cname, x, *maybe_splits):
        raw = to_bytes(x) if needs_bytes(x) else x
        # without splits: equal parts, sent as explicit splits so the received ones come back
        send = maybe_splits[0] if maybe_splits else even_splits(raw.shape[0], process_set)
        out, rsplits = commlib.alltoall(raw, splits=send, name=cname, process_set=process_set)
        if raw is not x:
            out = from_bytes(out, x.dtype, x.shape[1:])
        return [out, np.asarray(rsplits, dtype=np.int32)]

    out, rsplits = execute(fn, inputs, [t.dtype, tf.int32], "CommlibAlltoall", name,
                            ignore_name_scope, process_set, kind="alltoall")
    if t.shape.rank is not None:
        out.set_shape([None] + t.shape.as_list()[1:])
    rsplits.set_shape([set_size(process_set)])
    return out, rsplits


def _reducescatter_raw(t, op, pre=1.0, post=1.0, name=None, ignore_name_scope=False,
                       process_set=None):
    check_has_rows(t.shape.rank, "reducescatter")

    def fn(cname, x):
        return [commlib.reducescatter(x, op=op, name=cname, prescale_factor=pre,
                                      postscale_factor=post, process_set=process_set)]

    (y,) = execute(fn, [t], [t.dtype], "CommlibReducescatter", name, ignore_name_scope,
                    process_set, kind="reducescatter")
    if t.shape.rank is not None:
        dims = t.shape.as_list()
        if dims[0] is not None:
            dims[0] = reducescatter_rows(dims[0], process_set)
        y.set_shape(dims)
    return y


def _barrier_raw(process_set=None):
    def fn(_cname):
        commlib.barrier(process_set=process_set)
        return [np.zeros((), dtype=np.int32)]

    (y,) = execute(fn, [], [tf.int32], "CommlibBarrier", process_set=process_set)
    return y


# The gradient-free forms, for exchanges the frontends build themselves (Keras ZeRO).
reducescatter_raw = _reducescatter_raw
grouped_allgather_raw = _grouped_allgather_raw


# ------------------------------------------------------------ differentiable ops

def _dense(g):
    return tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g


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


def _differentiable(t) -> bool:
    return t.dtype.is_floating or t.dtype.is_complex


def _allreduce_op(t, op, pre, post, name, ignore_name_scope, ps):
    if not _differentiable(t):
        return _allreduce_raw(t, op, pre, post, name, ignore_name_scope, ps)

    @tf.custom_gradient
    def f(x):
        y = _allreduce_raw(x, op, pre, post, name, ignore_name_scope, ps)
        return y, lambda dy: _allreduce_grad(x, y, dy, op, pre, post, ignore_name_scope, ps)

    return f(t)


def _grouped_allreduce_op(ts, op, pre, post, name, ignore_name_scope, ps):
    if not all(_differentiable(t) for t in ts) or op not in (Sum, Average, Adasum):
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
    if not _differentiable(t):
        return _allgather_raw(t, name, ignore_name_scope, ps)

    @tf.custom_gradient
    def f(x):
        y = _allgather_raw(x, name, ignore_name_scope, ps)
        return y, lambda dy: _allgather_grad(x, dy, ignore_name_scope, ps)

    return f(t)


def _grouped_allgather_op(ts, name, ignore_name_scope, ps):
    # one op, so that the group draws one generated name eagerly and in graphs alike
    if not any(_differentiable(t) for t in ts):
        return _grouped_allgather_raw(ts, name, ignore_name_scope, ps)

    @tf.custom_gradient
    def f(*xs):
        ys = _grouped_allgather_raw(list(xs), name, ignore_name_scope, ps)

        def grad(*dys):
            return [_allgather_grad(x, tf.zeros_like(y) if d is None else d, ignore_name_scope, ps)
                    if _differentiable(x) else None for x, y, d in zip(xs, ys, dys)]

        return ys, grad

    return list(f(*ts))


def _broadcast_op(t, root_rank, name, ignore_name_scope, ps):
    if not _differentiable(t):
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


def _alltoall_op(t, splits, name, ignore_name_scope, ps):
    if not _differentiable(t):
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


def _reducescatter_op(t, op, pre, post, name, ignore_name_scope, ps):
    if not _differentiable(t):
        return _reducescatter_raw(t, op, pre, post, name, ignore_name_scope, ps)

    @tf.custom_gradient
    def f(x):
        y = _reducescatter_raw(x, op, pre, post, name, ignore_name_scope, ps)

        def grad(dy):
            g = _allgather_raw(_dense(dy), ignore_name_scope=ignore_name_scope, process_set=ps)
            scale = reducescatter_grad_scale(op, set_size(ps), pre, post)
            g = g * tf.cast(scale, g.dtype) if scale != 1.0 else g
            return tf.reshape(g, tf.shape(x))

        return y, grad

    return f(t)


# ------------------------------------------------------------ public API (Horovod's)

def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=None, ignore_name_scope=False):
    """Reduces ``tensor`` (tf.Tensor, tf.Variable or tf.IndexedSlices) over all
    ranks (of ``process_set``); ``op`` Average (default; divides by the set's
    size), Sum, Min, Max, Product or Adasum (floating-point tensors). IndexedSlices are allgathered (values and
    indices) instead, as in Horovod. The result has the input's shape and
    dtype (integer Average truncates toward zero)."""
    sparse = isinstance(tensor, tf.IndexedSlices)
    with collective_call("allgather" if sparse else "allreduce", name, process_set):
        process_set = check_process_set(process_set)
        op = resolve_op(op, average)
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
    sparse = any(isinstance(t, tf.IndexedSlices) for t in tensors or ())
    with collective_call("allgather" if sparse else "allreduce", name, process_set):
        return _grouped_allreduce(tensors, op, average, compression, prescale_factor,
                                  postscale_factor, process_set, ignore_name_scope, name)


def _grouped_allreduce(tensors, op, average, compression, prescale_factor, postscale_factor,
                       process_set, ignore_name_scope, name):
    process_set = check_process_set(process_set)
    if not tensors:
        return tensors
    op = resolve_op(op, average)
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


def allgather(tensor, name=None, ignore_name_scope=False, process_set=None):
    """Concatenates every rank's ``tensor`` (of ``process_set``, in the order
    of its ranks) along dimension 0 (whose size may differ across ranks; the
    other dimensions must agree)."""
    with collective_call("allgather", name, process_set):
        process_set = check_process_set(process_set)
        t = _as_tensor(tensor)
        check_dtype(t.dtype, "allgather", movable=True)
        return _allgather_op(t, name, ignore_name_scope, process_set)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=None):
    """Allgathers a list of tensors with one op (started together)."""
    with collective_call("grouped_allgather", name, process_set):
        process_set = check_process_set(process_set)
        if not tensors:
            return tensors
        ts = [_as_tensor(t) for t in tensors]
        for t in ts:
            check_dtype(t.dtype, "grouped_allgather", movable=True)
            check_has_rows(t.shape.rank, "allgather", several=True)
        return _grouped_allgather_op(ts, name, ignore_name_scope, process_set)


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=None):
    """Rank ``root_rank``'s ``tensor`` on every rank (of ``process_set``;
    root_rank is a job rank in the set)."""
    with collective_call("broadcast", name, process_set):
        process_set = check_process_set(process_set)
        check_root(root_rank, process_set)
        t = _as_tensor(tensor)
        check_dtype(t.dtype, "broadcast", movable=True)
        return _broadcast_op(t, root_rank, name, ignore_name_scope, process_set)


def broadcast_(variables, root_rank, name=None, process_set=None):
    """In-place broadcast of ``variables`` (a variable or a list) from
    ``root_rank``; returns their new values."""
    from .functions import broadcast_variables

    single = not isinstance(variables, (list, tuple))
    vs = [variables] if single else list(variables)
    op = broadcast_variables(vs, root_rank, process_set=process_set, name=name)
    if tf.executing_eagerly():
        values = [tf.convert_to_tensor(v) for v in vs]
    else:
        with tf.control_dependencies([op]):
            values = [tf.identity(v) for v in vs]
    return values[0] if single else values


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=None):
    """Sends rows ``splits[i]`` of dimension 0 to rank i (of ``process_set``:
    its i-th member; equal parts when splits is None) and returns the rows
    received, in rank order; with ``splits``, returns ``(output,
    received_splits)`` as Horovod does."""
    with collective_call("alltoall", name, process_set):
        process_set = check_process_set(process_set)
        t = _as_tensor(tensor)
        check_dtype(t.dtype, "alltoall", movable=True)
        out, rsplits = _alltoall_op(t, splits, name, ignore_name_scope, process_set)
        return (out, rsplits) if splits is not None else out


def reducescatter(tensor, device_dense='', compression=Compression.none, op=Average,
                  name=None, process_set=None, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces ``tensor`` over all ranks (of ``process_set``) and leaves on
    each rank its part of dimension 0 (part i on the set's i-th member; lower
    positions get the extra rows)."""
    with collective_call("reducescatter", name, process_set):
        process_set = check_process_set(process_set)
        op = resolve_op(op)
        t = _as_tensor(tensor)
        check_dtype(t.dtype, "reducescatter")
        c, ctx = compression.compress(t)
        r = _reducescatter_op(c, op, prescale_factor, postscale_factor, name,
                              ignore_name_scope, process_set)
        return compression.decompress(r, ctx)


def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=Average,
                          process_set=None, prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter of each tensor of a list; a 0-d tensor anywhere in the
    list raises ScalarTensorError before any of them is sent."""
    with collective_call("reducescatter", None, process_set):
        tensors = [_as_tensor(t) for t in tensors]
        for t in tensors:
            check_has_rows(t.shape.rank, "reducescatter", several=True)
        return [reducescatter(t, device_dense, compression, op, process_set=process_set,
                              prescale_factor=prescale_factor,
                              postscale_factor=postscale_factor)
                for t in tensors]


def barrier(process_set=None):
    """Returns once every rank (of ``process_set``) has reached it (eagerly:
    when called; in a graph: when the returned op runs)."""
    with collective_call(None):
        process_set = check_process_set(process_set)
        if tf.executing_eagerly():
            commlib.barrier(process_set=process_set)
            return None
        return _barrier_raw(process_set).op


def join():
    """This rank has no more collectives to submit; until every rank has
    joined it takes part in the others' (zeros to reductions, no rows to
    gathers: see ``commlib.join``). Returns the rank that joined last, as an
    int32 tensor (eagerly: at once; in a graph: when the op runs)."""
    if tf.executing_eagerly():
        with collective_call(None):
            return tf.constant(commlib.join(), dtype=tf.int32)

    def fn(_cname):
        return [np.array(commlib.join(), dtype=np.int32)]

    (y,) = execute(fn, [], [tf.int32], "CommlibJoin", process_set=None)
    return y


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------ topology as ops

def size_op(process_set_id=0, name=None):
    """The number of ranks of the process set with this id (0: the job)."""
    return tf.constant(set_size(process_set_by_id(process_set_id)), dtype=tf.int32,
                       name=name)


def local_size_op(name=None):
    return tf.constant(commlib.local_size(), dtype=tf.int32, name=name)


def rank_op(name=None):
    return tf.constant(commlib.rank(), dtype=tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(commlib.local_rank(), dtype=tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    """1 when this rank belongs to the process set with this id, else 0."""
    ps = process_set_by_id(process_set_id)
    return tf.constant(1 if included(ps) else 0, dtype=tf.int32, name=name)

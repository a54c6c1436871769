"""Gradient-free collectives on tf tensors (one ``execute`` op each) and the
helpers the differentiable ones (allreduce, gather, broadcast, reducescatter)
share; also used by exchanges the frontends build themselves (gradient tapes,
Keras ZeRO)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

import commlib
from commlib.checks import SPLITS_NOT_INTEGERS, check_has_rows
from commlib.ops import Sum, even_splits, reducescatter_rows
from commlib.process_sets import set_size

from .. import buffers
from ..execution import execute, from_bytes, needs_bytes, to_bytes

# Deliberate: TF sums allgather/broadcast upstream gradients (horovod.torch averages).

GRAD_GATHER_OP = Sum


def as_tensor(value):
    if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
        raise TypeError(f"commlib.tensorflow's collectives move dense tensors (and allreduce "
                        f"IndexedSlices), got a {type(value).__name__}; make it dense first "
                        "(.to_tensor(), tf.sparse.to_dense)")
    return tf.convert_to_tensor(value)


def allreduce_raw(t, op, pre=1.0, post=1.0, name=None, ignore_name_scope=False,
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


def allgather_raw(t, name=None, ignore_name_scope=False, process_set=None):
    check_has_rows(t.shape.rank, "allgather")

    def fn(cname, x):
        return [_allgather_np(x, cname, process_set)]

    (y,) = execute(fn, [t], [t.dtype], "CommlibAllgather", name, ignore_name_scope,
                    process_set, kind="allgather")
    if t.shape.rank is not None:
        y.set_shape([None] + t.shape.as_list()[1:])
    return y


def grouped_allgather_raw(ts, name=None, ignore_name_scope=False, process_set=None):
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


def broadcast_raw(t, root_rank, name=None, ignore_name_scope=False, process_set=None):
    def fn(cname, x):
        return [_broadcast_np(x, root_rank, cname, process_set)]

    (y,) = execute(fn, [t], [t.dtype], "CommlibBroadcast", name, ignore_name_scope,
                    process_set, kind="broadcast")
    y.set_shape(t.shape)
    return y


def alltoall_raw(t, splits, name=None, ignore_name_scope=False, process_set=None):
    """(output, received_splits as int32)."""
    check_has_rows(t.shape.rank, "alltoall")
    inputs = [t]
    if splits is not None:
        given = tf.convert_to_tensor(splits)
        if not given.dtype.is_integer or given.shape.rank not in (None, 1):
            raise ValueError(SPLITS_NOT_INTEGERS)  # (floats are refused, not truncated)
        inputs.append(tf.cast(given, tf.int64))

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


def reducescatter_raw(t, op, pre=1.0, post=1.0, name=None, ignore_name_scope=False,
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


def barrier_raw(process_set=None):
    def fn(_cname):
        commlib.barrier(process_set=process_set)
        return [np.zeros((), dtype=np.int32)]

    (y,) = execute(fn, [], [tf.int32], "CommlibBarrier", process_set=process_set)
    return y


def dense(g):
    return tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g


def differentiable(t) -> bool:
    return t.dtype.is_floating or t.dtype.is_complex


try:  # TensorFlow's own test of whether an op run now may be recorded (a tape or accumulator)
    from tensorflow.python.eager.record import could_possibly_record as _could_record
except ImportError:  # pragma: no cover - another TensorFlow: always take the recorded way
    def _could_record() -> bool:
        return True


def records_gradient(*ts) -> bool:
    """Whether a collective on ``ts`` needs its gradient function: one of
    them is floating-point (or complex) and the call is traced into a graph
    (a tape may differentiate the function later) or runs eagerly while a
    GradientTape or a forward accumulator is active. Otherwise the
    ``tf.custom_gradient`` wrapper, ~200 us of an eager call, is skipped."""
    return any(differentiable(t) for t in ts) and (not tf.executing_eagerly() or _could_record())

"""reducescatter and grouped_reducescatter on tf tensors, differentiable."""
from __future__ import annotations

import tensorflow as tf

from commlib.checks import check_has_rows, scale_factors, tensor_group
from commlib.ops import Average
from commlib.process_sets import check_process_set, set_size
from commlib.reduce_args import reducescatter_grad_scale, resolve_op

from ..compression import Compression
from ..execution import check_dtype, collective_call
from .raw import allgather_raw as _allgather_raw
from .raw import as_tensor as _as_tensor
from .raw import dense as _dense
from .raw import records_gradient as _records_gradient
from .raw import reducescatter_raw as _reducescatter_raw

def _reducescatter_op(t, op, pre, post, name, ignore_name_scope, ps):
    if not _records_gradient(t):
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


def reducescatter(tensor, device_dense='', compression=Compression.none, op=Average,
                  name=None, process_set=None, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces ``tensor`` over all ranks (of ``process_set``) and leaves on
    each rank its part of dimension 0 (part i on the set's i-th member; lower
    positions get the extra rows)."""
    with collective_call("reducescatter", name, process_set, "CommlibReducescatter", ignore_name_scope):
        process_set = check_process_set(process_set)
        op = resolve_op(op)
        prescale_factor, postscale_factor = scale_factors(prescale_factor, postscale_factor)
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
    with collective_call("reducescatter", None, process_set, "CommlibReducescatter"):
        tensors = [_as_tensor(t) for t in tensor_group(tensors, "grouped_reducescatter")]
        for t in tensors:
            check_has_rows(t.shape.rank, "reducescatter", several=True)
        return [reducescatter(t, device_dense, compression, op, process_set=process_set,
                              prescale_factor=prescale_factor,
                              postscale_factor=postscale_factor)
                for t in tensors]

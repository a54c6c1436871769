"""Point-to-point messages on tf.Tensor, eagerly and inside tf.function.

    import commlib.tensorflow as hvd
    if hvd.rank() == 0:
        with tf.GradientTape() as tape:
            h = part1(x)
            token = hvd.send(h, dst=1, tag=3)
        grads = tape.gradient(token, part1.trainable_variables)   # receives h's gradient
    else:
        h = hvd.recv(src=0, tag=3, dtype=tf.float32)  # shape comes with the message
        with tf.GradientTape() as tape:
            tape.watch(h)
            loss = loss_fn(part2(h), y)
        *grads, dh = tape.gradient(loss, part2.trainable_variables + [h])
        hvd.send(dh, dst=0, tag=hvd.gradient_tag(3))               # h's gradient, back to rank 0

The numpy API's semantics (``commlib.send`` ...): the receiver learns the
shape; messages are matched by (source, tag, process set). Eagerly the
receiver learns the dtype too; inside tf.function ``recv`` needs ``dtype``
(a graph's output dtype is fixed when it is traced) and takes an optional
``shape`` for the static shape (unknown otherwise). Inside tf.function each
send/recv is one ordered ``tf.numpy_function`` op (see collectives), so they run
in program order.

``send`` returns a scalar token; when the tensor is differentiable, the
token's gradient (``tape.gradient(token, ...)``, or the token added to a
loss) is a receive of the tensor's gradient from ``dst`` with tag
``gradient_tag(tag)`` (tag + 2**62), which the receiver sends as shown.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

import commlib
from commlib.pipeline.tags import GRADIENT_TAG_BASE, gradient_tag

from .execution import check_dtype, execute

__all__ = ["send", "recv", "gradient_tag"]


def _send_raw(t, dst, tag, process_set):
    check_dtype(t.dtype, "send")

    def fn(_cname, x):
        commlib.send(x, dst, tag, process_set)
        return [np.zeros((), np.float32)]

    (token,) = execute(fn, [t], [tf.float32], "CommlibSend", process_set=process_set)
    token.set_shape([])
    return token


def _recv_raw(src, tag, dtype, shape, process_set):
    if dtype is None:
        if not tf.executing_eagerly():
            raise TypeError("commlib.tensorflow.recv inside tf.function needs dtype= (the "
                            "graph's output dtype is fixed when it is traced)")
        return tf.convert_to_tensor(commlib.recv(src, tag, process_set=process_set))
    dtype = tf.as_dtype(dtype)
    check_dtype(dtype, "recv")

    def fn(_cname):
        arr = commlib.recv(src, tag, process_set=process_set)
        if arr.dtype != dtype.as_numpy_dtype:
            raise TypeError(f"recv from rank {src} (tag {tag}) expected {dtype.name}, the "
                            f"message is {arr.dtype}")
        return [arr]

    (y,) = execute(fn, [], [dtype], "CommlibRecv", process_set=process_set)
    if shape is not None:
        y.set_shape(shape)
    return y


def _is_gradient_tag(tag) -> bool:
    return isinstance(tag, (int, np.integer)) and tag >= GRADIENT_TAG_BASE


def send(tensor, dst, tag=0, process_set=None):
    """Sends ``tensor`` to job rank ``dst`` (returns once the receiver took
    it); returns a scalar float32 token whose gradient receives the tensor's
    gradient from ``dst`` (floating tensors sent with a forward tag, below
    2**62; a send with a gradient tag is not differentiated)."""
    t = tf.convert_to_tensor(tensor)
    if not (t.dtype.is_floating or t.dtype.is_complex) or _is_gradient_tag(tag):
        return _send_raw(t, dst, tag, process_set)

    @tf.custom_gradient
    def f(x):
        token = _send_raw(x, dst, tag, process_set)

        def grad(_dtoken):
            g = _recv_raw(dst, gradient_tag(tag), x.dtype, None, process_set)
            return tf.reshape(g, tf.shape(x))

        return token, grad

    return f(t)


def recv(src, tag=0, dtype=None, shape=None, process_set=None):
    """Receives the next message from job rank ``src`` with ``tag`` as a
    tensor of the sender's shape (and dtype; ``dtype`` is required inside
    tf.function, and checked against the message when given)."""
    return _recv_raw(src, tag, dtype, shape, process_set)

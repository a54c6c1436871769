"""One-step delayed gradient averaging for TensorFlow: the state that lives
between steps (at most one grouped allreduce in flight) and the op that
swaps this step's gradients for the previous step's average.

``DelayedExchange.swap_op(grads)`` is one ordered commlib op (eagerly, or a
numpy_function inside tf.function): it waits for the pending average (started
by the previous step, so it had the whole forward and backward pass to
travel), starts averaging ``grads`` into buffers of its own (progressed by the
core's background thread while TensorFlow goes on; the gradients are read
there, in place, and kept alive until then), and returns ``(have, average)``:
``have`` is False at the first step (and after ``finish()``), when there is
no previous average and ``average`` is zeros.

Used by the Keras ``DistributedOptimizer(..., staleness=1)`` and
``DistributedGradientTape(..., staleness=1)``.

Memory: the averages live in aligned buffers (see buffers.py) that are
reused from step to step, two sets in turn: a set is reused only when nothing
else holds it any more (the tensors made from it are gone); otherwise new
ones are allocated, so an average a caller keeps is never overwritten. (With
a fresh copy of the gradients every step, staleness 1 ran slower than
synchronous averaging.)
"""
from __future__ import annotations

import collections
import itertools

import numpy as np
import tensorflow as tf

import commlib
from commlib.errors import CommlibError
from commlib.process_sets import check_process_set, included, set_size

from .buffers import OutputPool
from .compression import Compression
from .execution import check_dtype, execute

_instances = collections.defaultdict(itertools.count)


def settle(handle) -> None:
    """Waits for ``handle`` (None: nothing) and drops its result, or its
    error: what an exchange whose weights were replaced ends with."""
    if handle is not None:
        try:
            commlib.synchronize(handle)
        except CommlibError:
            pass


class DelayedExchange:
    """The pending average of one optimizer (see the module's docstring).
    Built on every rank (of ``process_set``) in the same order: the i-th one
    of a set names its allreduces ``delayed<i>``."""

    def __init__(self, op=commlib.Average, prescale=1.0, postscale=1.0, process_set=None):
        self.process_set = check_process_set(process_set, member=False)
        self.op, self.scales = op, (prescale, postscale)
        self.communicate = included(self.process_set) and set_size(self.process_set) > 1
        self.name = f"delayed{next(_instances[self.process_set.process_set_id])}"
        self._pending = None  # (handle or None, arrays)
        self._decompress = (Compression.none, [])  # (of the last swap_op: compression, ctxs)
        self._pool = OutputPool(layouts=1, per_layout=2)  # (pending, lent out: a set each)

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def start(self, arrays) -> None:
        """Starts averaging ``arrays`` (numpy) into buffers of its own. The
        arrays are read by the background thread after this returns: the
        handle keeps them alive meanwhile (TensorFlow's memory behind them,
        which it neither reuses nor updates in place while they live)."""
        if self._pending is not None:
            raise RuntimeError("an average is already pending; finish() it first")
        arrays = [np.asarray(a) for a in arrays]
        bufs = self._pool.take(arrays)
        handle = None
        if self.communicate and bufs:
            pre, post = self.scales
            handle = commlib.grouped_allreduce_async(arrays, name=self.name, op=self.op,
                                                     prescale_factor=pre, postscale_factor=post,
                                                     process_set=self.process_set, out=bufs)
        else:  # (no one to average with: the average is a copy of this rank's own)
            for b, a in zip(bufs, arrays):
                np.copyto(b, a)
        self._pending = (handle, bufs)

    def finish(self):
        """Waits for the pending average: (True, arrays), or (False, None)
        when none is pending."""
        if self._pending is None:
            return False, None
        handle, bufs = self._pending
        if handle is not None:
            commlib.synchronize(handle)  # a failed one stays pending: its error again
        self._pending = None
        return True, bufs

    def drop(self) -> None:
        """Waits for a pending average, if any, and forgets it (failed or
        not): the weights it was for were replaced."""
        if self._pending is not None:
            (handle, _), self._pending = self._pending, None
            settle(handle)

    def swap(self, arrays):
        """finish() then start(arrays); the previous average must have the
        same shapes and dtypes (ValueError otherwise)."""
        have, prev = self.finish()
        arrays = [np.asarray(a) for a in arrays]
        if have and [(a.shape, a.dtype) for a in prev] != [(a.shape, a.dtype) for a in arrays]:
            raise ValueError("staleness=1: the gradients of this step do not match the pending "
                             "ones (the variables with a gradient changed between steps)")
        self.start(arrays)  # (into the buffers the previous swap lent out, if released)
        return have, prev

    def swap_op(self, tensors, compression=Compression.none):
        """The swap as one ordered commlib op: ``(have, averages)`` as
        tensors. With ``compression`` (Compression.fp16) the gradients travel
        and wait in its wire dtype and the averages come back in their own."""
        packed = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
        tensors = [t for t, _ in packed]
        for t in tensors:
            check_dtype(t.dtype, "DistributedOptimizer(staleness=1) gradients")
        ctxs = [ctx for _, ctx in packed]
        self._decompress = (compression, ctxs)

        def fn(_cname, *arrays):
            have, prev = self.swap(list(arrays))
            if not have:
                prev = [np.zeros_like(a) for a in arrays]
            return [np.array(have)] + prev

        outs = execute(fn, tensors, [tf.bool] + [t.dtype for t in tensors],
                       "CommlibDelayedSwap", process_set=self.process_set)
        for o, t in zip(outs[1:], tensors):
            o.set_shape(t.shape)
        outs[0].set_shape(())
        return outs[0], [compression.decompress(o, c) for o, c in zip(outs[1:], ctxs)]

    def finish_tensors(self):
        """Eagerly, finish() as tensors in the dtypes of the last swap_op's
        gradients: (True, tensors), or (False, None)."""
        have, arrays = self.finish()
        if not have:
            return False, None
        compression, ctxs = self._decompress
        return True, [compression.decompress(tf.convert_to_tensor(a), c)
                      for a, c in zip(arrays, ctxs)]

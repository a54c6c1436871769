"""One-step delayed gradient averaging for TensorFlow (the rule is
commlib.delayed's): the op that swaps this step's gradients for the previous
step's average, for the Keras ``DistributedOptimizer(..., staleness=1)`` and
``DistributedGradientTape(..., staleness=1)``.

``DelayedExchange.swap_op(grads)`` is one ordered commlib op (eagerly, or a
numpy_function inside tf.function): it waits for the pending average, starts
averaging ``grads`` (read in place by the core's background thread while
TensorFlow goes on) and returns ``(have, average)``: ``have`` is False at the
first step (and after ``finish()``), when ``average`` is zeros. The averages
live in reused aligned buffers (buffers.py), two sets in turn: a set is
reused only once nothing holds it, so an average a caller keeps is never
overwritten.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

import commlib
from commlib.delayed import DelayedArrays
from commlib.process_sets import check_process_set, communicates, instance_name

from .buffers import OutputPool
from .compression import Compression
from .execution import check_dtype, execute

class DelayedExchange(DelayedArrays):
    """The pending average of one optimizer. Built on every rank (of
    ``process_set``) in the same order: the i-th one of a set names its
    allreduces ``delayed<i>``."""

    def __init__(self, op=commlib.Average, prescale=1.0, postscale=1.0, process_set=None):
        process_set = check_process_set(process_set, member=False)
        pool = OutputPool(layouts=1, per_layout=2)  # (pending, lent out: a set each)
        super().__init__(instance_name("delayed", process_set), pool.take, op,
                         (prescale, postscale), process_set, communicates(process_set))
        self._decompress = (Compression.none, [])  # (of the last swap_op: compression, ctxs)

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
            return [np.array(have)] + (prev if have else [np.zeros_like(a) for a in arrays])

        outs = execute(fn, tensors, [tf.bool] + [t.dtype for t in tensors],
                       "CommlibDelayedSwap", process_set=self.process_set)
        for o, t in zip(outs, [()] + [t.shape for t in tensors]):
            o.set_shape(t)
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

"""The pending meeting of ``LocalSGD(..., streaming=True)`` for TensorFlow:
a snapshot of the model's weights whose averaging across ranks runs on the
core's background thread during the next round (see keras/local_sgd.py).

commlib.local_sgd's StreamingMeetings as two ordered commlib ops (eagerly, or
numpy_functions inside tf.function): ``finish(like)`` waits for the pending
average and returns ``(have, average, snapshot)`` (zeros shaped like
``like`` and have False when none is pending), and ``start(values)`` copies
``values`` into a snapshot and starts averaging it. The snapshot and the
average live in reused aligned buffers (buffers.py): a set is reused only
once nothing refers to it.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from commlib import local_sgd
from commlib.delayed import PendingAverage
from commlib.process_sets import communicates, instance_name

from .buffers import OutputPool
from .execution import execute


class StreamingMeetings(local_sgd.StreamingMeetings):
    """Built on every rank (of ``process_set``) in the same order: the i-th
    one of a set names its allreduces ``LocalSGDStream<i>``."""

    def __init__(self, process_set):
        super().__init__(self._begin)
        self.process_set = process_set
        self.communicate = communicates(process_set)
        self.name = instance_name("LocalSGDStream", process_set)
        self._pool = OutputPool(layouts=1, per_layout=4)  # (pending and lent: two sets each)

    def _begin(self, arrays):
        arrays = [np.asarray(a) for a in arrays]
        snapshot, average = self._pool.take(arrays), self._pool.take(arrays)
        for s, a in zip(snapshot, arrays):
            np.copyto(s, a)
        return PendingAverage(snapshot, average, self.name, process_set=self.process_set,
                              communicate=self.communicate)

    def finish(self, like):
        like = [tf.convert_to_tensor(t) for t in like]

        def fn(_cname):
            have, average, snapshot = super(StreamingMeetings, self).finish()
            if not have:
                average = snapshot = [np.zeros(t.shape, t.dtype.as_numpy_dtype) for t in like]
            return [np.array(have)] + list(average) + list(snapshot)

        outs = execute(fn, [], [tf.bool] + [t.dtype for t in like] * 2, "CommlibStreamFinish",
                       process_set=self.process_set)
        outs[0].set_shape(())
        for o, t in zip(outs[1:], like + like):
            o.set_shape(t.shape)
        n = len(like)
        return outs[0], outs[1:1 + n], outs[1 + n:]

    def start(self, values):
        values = [tf.convert_to_tensor(t) for t in values]

        def fn(_cname, *arrays):
            super(StreamingMeetings, self).start(list(arrays))
            return [np.array(True)]

        started = execute(fn, values, [tf.bool], "CommlibStreamStart", process_set=self.process_set)[0]
        started.set_shape(())
        return started

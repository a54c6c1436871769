"""PowerSGD's exchange step on TensorFlow tensors: the matrix products and
allreduces the rule of commlib.powersgd asks for (TFOps), and the reducer
that DistributedGradientTape and the Keras DistributedOptimizer call in
place of their plain allreduce (PowerSGDReducer). The compressor users
create, and its state variables, are in commlib.tensorflow.powersgd."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from commlib.powersgd import PowerSGDState
from commlib.process_sets import check_process_set, included, set_size

from .mpi_ops import grouped_allreduce_raw
from .powersgd import HALF_DTYPES, PowerSGD, StateVariables, check_options
from .variables import var_key


class TFOps:
    """commlib.powersgd.TensorOps for tf tensors (eager or in a graph)."""

    def __init__(self, op, pre, post, process_set):
        self.op, self.pre, self.post, self.process_set = op, pre, post, process_set

    @staticmethod
    def matrix(grad, rows, cols):
        m = tf.reshape(grad, [rows, cols])
        return tf.cast(m, tf.float32) if m.dtype in HALF_DTYPES else m

    @staticmethod
    def restore(matrix, grad):
        return tf.cast(tf.reshape(matrix, grad.shape), grad.dtype)

    @staticmethod
    def random(shape, generator, like):
        return tf.constant(generator.standard_normal(shape), dtype=like.dtype)

    def seeded_random(self, shape, seq, like):
        if not any(tf.is_tensor(s) for s in seq):
            return self.random(shape, np.random.default_rng(seq), like)
        dtype = like.dtype.as_numpy_dtype

        def draw(*s):
            seeds = tuple(int(x) for x in s)
            return np.random.default_rng(seeds).standard_normal(shape).astype(dtype)

        out = tf.numpy_function(draw, [tf.cast(s, tf.int64) for s in seq], like.dtype)
        out.set_shape(shape)
        return out

    matmul = staticmethod(tf.matmul)
    transpose = staticmethod(tf.transpose)
    columns = staticmethod(lambda m: tf.unstack(m, axis=1))
    stack_columns = staticmethod(lambda vectors: tf.stack(vectors, axis=1))
    dot = staticmethod(lambda u, v: tf.tensordot(u, v, 1))
    norm = staticmethod(lambda v: tf.sqrt(tf.reduce_sum(v * v)))
    maximum = staticmethod(lambda x, value: tf.maximum(x, tf.cast(value, x.dtype)))

    def allreduce(self, tensors, name):
        return grouped_allreduce_raw(list(tensors), self.op, self.pre, self.post, name=name,
                                     process_set=self.process_set)


class PowerSGDReducer:
    """``allreduce_grads(grads, variables) -> grads`` (make_allreduce_grads'
    interface) running one exchange step of the rule on ``state`` (a
    StateVariables, created at the first call by ``make_state(variables)``,
    by default a new one)."""

    def __init__(self, config, op, pre, post, process_set, sparse_as_dense, name,
                 make_state=None):
        self.config = config
        self.process_set = check_process_set(process_set, member=False)
        self._member = included(self.process_set)
        self.local_divisor = set_size(self.process_set) if self._member else 1
        self._ops = TFOps(op, pre, post, self.process_set)
        self._sparse_as_dense = sparse_as_dense
        self._name = name
        self._make_state = make_state or (lambda vs: StateVariables(config, vs, name))
        self.state = None
        self._rule = None

    def build(self, variables) -> None:
        if self.state is None:
            self.state = self._make_state(list(variables))
        self.state.check_sources(list(variables))
        if self._rule is None:
            self._rule = PowerSGDState(self.config, self.state.named_shapes, self._ops,
                                       name=f"{self._name}.powersgd")

    @property
    def variables(self) -> list:
        return [] if self.state is None else self.state.variables

    def __call__(self, grads, variables=None):
        grads = list(grads)
        if variables is None:
            raise ValueError("compression=PowerSGD needs the variables of the gradients")
        if self._sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        for g, v in zip(grads, variables):
            if isinstance(g, tf.IndexedSlices):
                raise ValueError(f"compression=PowerSGD needs dense gradients, but the gradient "
                                 f"of {v.name!r} is sparse (IndexedSlices); pass "
                                 "sparse_as_dense=True")
        if not self._member:
            return grads
        self.build(variables)
        state = self.state
        present = {state.names[var_key(v)]: tf.convert_to_tensor(g)
                   for g, v in zip(grads, variables) if g is not None}
        order = sorted(present, key=lambda n: int(n.split(":", 1)[0]))
        eager = tf.executing_eagerly()

        def compressed():
            step = int(state.step.numpy()) if eager else tf.convert_to_tensor(state.step)
            errors = {n: tf.convert_to_tensor(v) for n, v in state.errors.items()}
            qs = {n: tf.convert_to_tensor(v) for n, v in state.qs.items()}
            result, errors, qs = self._rule.compressed(present, errors, qs, step)
            for n, v in state.errors.items():
                v.assign(errors[n])
            for n, v in state.qs.items():
                v.assign(qs[n])
            return [result[n] for n in order]

        def plain():
            result = self._rule.plain(present)
            return [result[n] for n in order]

        start = self.config.start_step
        if start == 0:
            outs = compressed()
        elif eager:
            outs = compressed() if int(state.step.numpy()) >= start else plain()
        else:
            outs = tf.cond(tf.convert_to_tensor(state.step) >= start, compressed, plain)
        state.step.assign_add(1)
        reduced = dict(zip(order, outs))
        return [None if g is None else reduced[state.names[var_key(v)]]
                for g, v in zip(grads, variables)]


def tape_reducer(config, op, pre, post, process_set, sparse_as_dense, staleness, groups):
    """The allreduce_grads of a DistributedGradientTape with
    compression=PowerSGD: its state lives in ``config``, which must be an
    instance of this module's PowerSGD (tapes are made anew every step)."""
    check_options(op, staleness, 0, groups)
    if not isinstance(config, PowerSGD):
        raise ValueError("DistributedGradientTape(compression=...) takes "
                         "commlib.tensorflow.Compression.powersgd(...), created once before "
                         "the training loop (it holds the state between steps)")

    def make_state(variables):
        return config.build(variables)

    return PowerSGDReducer(config, op, pre, post, process_set, sparse_as_dense, "tape",
                           make_state)

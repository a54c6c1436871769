"""PowerSGD in TensorFlow: low-rank gradient compression with error feedback
(the rule: commlib.powersgd) for the Keras ``DistributedOptimizer`` and for
``DistributedGradientTape``::

    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                   compression=hvd.Compression.powersgd(rank=2))

    psgd = hvd.Compression.powersgd(rank=2, start_step=10)   # once, before the loop
    with tf.GradientTape() as tape:
        loss = loss_fn(model(x), y)
    grads = hvd.DistributedGradientTape(tape, compression=psgd).gradient(
        loss, model.trainable_variables)

Each exchange step runs the rule over all the gradients at once: plain
grouped allreduce for the first ``start_step`` exchanges, then P with the
uncompressed gradients in one fused allreduce and Q in a second. It runs
eagerly and inside tf.function (``model.fit``): the state is TensorFlow
variables (the exchange step, the error of every compressed gradient, its
Q; a warm start's Q begins as the rule's seeded random draw) and the switch at
``start_step`` is a tf.cond on the step. Products run in float32 for
float16/bfloat16 gradients.

A tape lives for one step, so the tape's state lives in the PowerSGD object:
pass the same object to every step's tape; ``psgd.build(sources)`` creates
the state ahead of the first step and ``psgd.variables`` lists it (to
checkpoint). The Keras optimizer keeps its own state (see keras/powersgd.py).

Not combined with: staleness, ZeRO (zero_stage > 0), groups, op other than
Average and Sum, sparse gradients (IndexedSlices: pass sparse_as_dense=True).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from commlib.ops import Average, Sum
from commlib.powersgd import PowerSGD as _PowerSGD
from commlib.powersgd import PowerSGDState, as_config, initial_q  # noqa: F401
from commlib.powersgd import check_options as _check_options
from commlib.process_sets import check_process_set, included, set_size
from commlib.signature import check_same_everywhere

_HALF = (tf.float16, tf.bfloat16)


class PowerSGD(_PowerSGD):
    """``Compression.powersgd(rank=2, start_step=10, min_compression_rate=2,
    error_feedback=True, warm_start=True, orthogonalization="gram-schmidt")``
    (see commlib.powersgd.PowerSGD). For DistributedGradientTape it also
    holds the rule's state across the steps' tapes: create it once."""

    _commlib_tape_state = None

    def build(self, sources) -> None:
        """Creates the tape's state for ``sources`` (the variables the tape
        differentiates; collective: every rank) if not done yet."""
        if self._commlib_tape_state is None:
            self._commlib_tape_state = StateVariables(self, list(sources), "tape")
        self._commlib_tape_state.check_sources(list(sources))

    @property
    def variables(self) -> list:
        """The tape's state as tf.Variables (the exchange step, then the
        errors and Q of the compressed gradients); [] before ``build``."""
        state = self._commlib_tape_state
        return [] if state is None else state.variables


def check_options(op, staleness=0, zero_stage=0, groups=None) -> None:
    """ValueError for options PowerSGD does not take."""
    if op not in (Average, Sum):
        raise ValueError("compression=PowerSGD supports op=Average and op=Sum only")
    _check_options(staleness, zero_stage, groups)


def _key(v):
    from .gradient_tape import var_key  # (gradient_tape imports this module's users)

    return var_key(v)


def _compute_dtype(dtype):
    dtype = tf.as_dtype(dtype)
    return tf.float32 if dtype in _HALF else dtype


class StateVariables:
    """The rule's state over a fixed list of variables, as tf.Variables
    (created eagerly, also when first reached inside a traced function)."""

    def __init__(self, config: _PowerSGD, variables: list, what: str):
        self.config = config
        self.keys = [_key(v) for v in variables]
        self.named_shapes = [(f"{i}:{getattr(v, 'path', None) or v.name}",
                              tuple(int(d) for d in v.shape)) for i, v in enumerate(variables)]
        self.names = {k: n for k, (n, _) in zip(self.keys, self.named_shapes)}
        plan = PowerSGDState(config, self.named_shapes, None).entries
        check_same_everywhere([repr(config)] + [(e.shape, e.rank) for e in plan],
                              f"PowerSGD ({what}): the configuration or the variables' shapes",
                              name=f"commlib.powersgd.{what}.signature")
        with tf.init_scope():
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                    name="commlib_powersgd_step")
            self.errors, self.qs = {}, {}
            for e in plan:
                if not e.compressed:
                    continue
                dtype = _compute_dtype(variables[e.index].dtype)
                if config.error_feedback:
                    self.errors[e.name] = tf.Variable(tf.zeros((e.rows, e.cols), dtype),
                                                      trainable=False,
                                                      name="commlib_powersgd_error")
                if config.warm_start:
                    self.qs[e.name] = tf.Variable(initial_q(config, e), dtype=dtype,
                                                  trainable=False, name="commlib_powersgd_q")

    @property
    def variables(self) -> list:
        return [self.step] + list(self.errors.values()) + list(self.qs.values())

    def check_sources(self, variables) -> None:
        unknown = [getattr(v, "name", "?") for v in variables if _key(v) not in self.names]
        if unknown:
            raise ValueError(f"PowerSGD's state was built for other variables; {unknown} are "
                             "new (pass the same sources at every step, or a new "
                             "Compression.powersgd for another model)")


class TFOps:
    """commlib.powersgd.TensorOps for tf tensors (eager or in a graph)."""

    def __init__(self, op, pre, post, process_set):
        self.op, self.pre, self.post, self.process_set = op, pre, post, process_set

    @staticmethod
    def matrix(grad, rows, cols):
        m = tf.reshape(grad, [rows, cols])
        return tf.cast(m, tf.float32) if m.dtype in _HALF else m

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
        from .mpi_ops import grouped_allreduce_raw

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
        present = {state.names[_key(v)]: tf.convert_to_tensor(g)
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
        return [None if g is None else reduced[state.names[_key(v)]]
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
        config.build(variables)
        return config._commlib_tape_state

    return PowerSGDReducer(config, op, pre, post, process_set, sparse_as_dense, "tape",
                           make_state)

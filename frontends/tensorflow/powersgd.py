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

import tensorflow as tf

from commlib.ops import Average, Sum
from commlib.powersgd import PowerSGD as _PowerSGD
from commlib.powersgd import PowerSGDState, as_config, initial_q  # noqa: F401
from commlib.powersgd import check_options as _check_options
from commlib.signature import check_same_everywhere

from .variables import var_key

HALF_DTYPES = (tf.float16, tf.bfloat16)  # (their products run in float32)


class PowerSGD(_PowerSGD):
    """``Compression.powersgd(rank=2, start_step=10, min_compression_rate=2,
    error_feedback=True, warm_start=True, orthogonalization="gram-schmidt")``
    (see commlib.powersgd.PowerSGD). For DistributedGradientTape it also
    holds the rule's state across the steps' tapes: create it once."""

    _commlib_tape_state = None

    def build(self, sources) -> "StateVariables":
        """Creates the tape's state for ``sources`` (the variables the tape
        differentiates; collective: every rank) if not done yet, and
        returns it (a StateVariables)."""
        if self._commlib_tape_state is None:
            self._commlib_tape_state = StateVariables(self, list(sources), "tape")
        self._commlib_tape_state.check_sources(list(sources))
        return self._commlib_tape_state

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
    return var_key(v)


def _compute_dtype(dtype):
    dtype = tf.as_dtype(dtype)
    return tf.float32 if dtype in HALF_DTYPES else dtype


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

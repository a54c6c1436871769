"""commlib.tensorflow.elastic: Horovod's ``horovod.tensorflow.elastic`` names
on commlib's restart-from-the-last-commit mode (see :mod:`commlib.elastic`),
for TF2 training loops of one's own (``model.fit`` users take
commlib.tensorflow.keras.elastic and its callbacks)::

    import tensorflow as tf
    import commlib.tensorflow as hvd

    hvd.init()
    model, opt = make_model(), tf.keras.optimizers.SGD(0.01, momentum=0.9)
    state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    @hvd.elastic.run
    def train(state):
        while state.step < steps:            # state.step: steps done
            train_step(*batch(state.step))
            state.step += 1
            if state.step % 10 == 0:
                state.commit()

    train(state)

launched as ``COMMLIB_ELASTIC_DIR=/shared/ckpt commlibrun -np 4 --restarts 3
python train.py``: when a rank fails, commlibrun starts the job again and
``train`` resumes from the newest commit that every rank finished (after
``@hvd.elastic.run`` has given every rank rank 0's state).

``TensorFlowState(variables, **user_state)`` holds a list of variables
instead (``tf.Variable`` or Keras variables: a model's, an optimizer's
once it has built its own, any others), for loops without a Keras model.
TF2 (eager) only: a TF1 ``session`` is refused.
"""
from __future__ import annotations

import numpy as np

from commlib.elastic import ELASTIC_DIR_ENV, ElasticStateError, ObjectState, State, run  # noqa: F401

from .collectives.state_sync import broadcast_variables
from .keras.elastic import KerasState

__all__ = ["TensorFlowState", "TensorFlowKerasState", "ObjectState", "State", "run",
           "ElasticStateError", "ELASTIC_DIR_ENV"]


class TensorFlowState(State):
    """The values of ``variables`` (a list of ``tf.Variable`` or Keras
    variables, in the same order on every rank) and any user values given as
    keywords (``state.step``...). ``commit()`` (a collective: every rank at
    the same points) keeps a copy and writes it to ``$COMMLIB_ELASTIC_DIR``;
    ``restore()`` assigns the last commit's values again; ``sync()`` gives
    every rank rank 0's values. A commit whose variables differ in number or
    shape from these raises ElasticStateError."""

    def __init__(self, variables=None, session=None, **user_state):
        if session is not None:
            raise NotImplementedError("TensorFlowState: TF1 sessions are not supported; in TF2 "
                                      "pass the variables to hold (eager)")
        if variables is None:
            raise ValueError("TensorFlowState needs the variables to hold, e.g. "
                             "variables=model.variables + optimizer.variables (TF2 keeps no "
                             "global list of them)")
        self.variables = list(variables)
        for k, v in enumerate(self.variables):
            if not (hasattr(v, "assign") and hasattr(v, "numpy") and hasattr(v, "shape")):
                raise TypeError(f"TensorFlowState: variable {k} is a {type(v).__name__}, "
                                f"not a tf.Variable or Keras variable")
        super().__init__(**user_state)

    def _snapshot(self) -> dict:
        return {"variables": [np.array(v.numpy(), copy=True) for v in self.variables]}

    def _apply(self, snapshot: dict) -> None:
        values = snapshot["variables"]
        if len(values) != len(self.variables):
            raise ElasticStateError(f"TensorFlowState holds {len(self.variables)} variables, the "
                                    f"commit {len(values)}; were the variables changed?")
        for k, (var, value) in enumerate(zip(self.variables, values)):
            if tuple(var.shape) != value.shape:
                raise ElasticStateError(f"TensorFlowState: variable {k} ({_name(var)}) has shape "
                                        f"{tuple(var.shape)}, the commit holds {value.shape}")
        for var, value in zip(self.variables, values):
            var.assign(value)

    def _sync_objects(self, root_rank: int) -> None:
        broadcast_variables(self.variables, root_rank=root_rank, name="elastic.tf_state")


def _name(variable) -> str:
    return str(getattr(variable, "path", None) or getattr(variable, "name", "?"))


class TensorFlowKerasState(KerasState):
    """A Keras model's variables, its optimizer's (``optimizer`` or else
    ``model.optimizer``: momenta and iteration count, built before a
    restart restores them) and any user values given as keywords:
    commlib.tensorflow.keras.elastic.KerasState under Horovod's name and
    signature (``backend``, Keras 2's backend module, is not used: Keras 3
    has one)."""

    def __init__(self, model, optimizer=None, backend=None, **user_state):
        super().__init__(model, optimizer, **user_state)

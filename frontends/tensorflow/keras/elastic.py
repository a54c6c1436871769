"""commlib.tensorflow.keras.elastic (also commlib.keras.elastic): Horovod's
``horovod.tensorflow.keras.elastic`` names on commlib's restart-from-the-
last-commit mode (see :mod:`commlib.elastic`)::

    import commlib.tensorflow.keras as hvd

    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam()), loss="mse")
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    callbacks = [hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10)]

    @hvd.elastic.run
    def train(state):
        for epoch in range(state.epoch, epochs):
            skip = state.batch * batch_size       # batches of this epoch already done
            model.fit(x[skip:], y[skip:], batch_size=batch_size, shuffle=False,
                      initial_epoch=epoch, epochs=epoch + 1, callbacks=callbacks)

    train(state)

launched as ``COMMLIB_ELASTIC_DIR=/shared/ckpt commlibrun -np 4 --restarts 3
python train.py``. The Update* callbacks must come before CommitStateCallback
in the list (Keras calls callbacks in list order), so that each commit
records the batch and epoch it follows.
"""
from __future__ import annotations

import keras
import numpy as np

from commlib.checks import positive_count
from commlib.elastic import ELASTIC_DIR_ENV, ElasticStateError, ObjectState, State, run  # noqa: F401

from ..collectives.state_sync import broadcast_variables

__all__ = ["KerasState", "ObjectState", "State", "run", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback", "ElasticStateError",
           "ELASTIC_DIR_ENV"]


class KerasState(State):
    """A Keras model's variables (trainable or not), its optimizer's variables
    (``optimizer`` or else ``model.optimizer``; momenta, iteration count;
    for LocalSGD also its counters, anchor and outer optimizer; for PowerSGD
    its step, Q and error buffers) and any user values given as keywords
    (``state.epoch``...). ``sync()`` leaves each rank's own error buffers."""

    def __init__(self, model, optimizer=None, **user_state):
        self.model = model
        self._optimizer = optimizer
        super().__init__(**user_state)

    @property
    def optimizer(self):
        return self._optimizer if self._optimizer is not None else getattr(
            self.model, "optimizer", None)

    def _optimizer_variables(self) -> list:
        if self.optimizer is None:
            return []
        v = self.optimizer.variables
        extra = getattr(self.optimizer, "commlib_state_variables", None)  # (LocalSGD's, PowerSGD's)
        return list(v() if callable(v) else v) + (extra() if extra is not None else [])

    def _snapshot(self) -> dict:
        # Weight prediction (staleness=1): the model holds predicted weights
        # between steps; commit the true ones.
        prediction = getattr(self.optimizer, "commlib_prediction", None)
        true = prediction.true_values() if prediction is not None else {}
        return {"model": [true[id(v)].copy() if id(v) in true else _to_numpy(v)
                          for v in self.model.variables],
                "optimizer": [_to_numpy(v) for v in self._optimizer_variables()]}

    def _apply(self, snapshot: dict) -> None:
        _assign(self.model.variables, snapshot["model"], "model")
        forget = getattr(self.optimizer, "commlib_forget", None)
        if forget is not None:  # (staleness=1: a pending average, a prediction)
            forget()
        saved = snapshot["optimizer"]
        if saved and self.optimizer is not None and not self.optimizer.built:
            # Keras creates optimizer variables on the first step; a restart
            # restores them before that step.
            self.optimizer.build(self.model.trainable_variables)
        if saved or self._optimizer_variables():
            _assign(self._optimizer_variables(), saved, "optimizer")

    def _sync_objects(self, root_rank: int) -> None:
        own = getattr(self.optimizer, "commlib_own_variables", None)  # (PowerSGD's error buffers)
        own = {id(v) for v in own()} if own is not None else set()
        broadcast_variables(list(self.model.variables)
                            + [v for v in self._optimizer_variables() if id(v) not in own],
                            root_rank=root_rank, name="elastic.keras_state")


def _to_numpy(variable) -> np.ndarray:
    return np.array(keras.ops.convert_to_numpy(variable), copy=True)


def _assign(variables, values, what: str) -> None:
    variables = list(variables)
    if len(variables) != len(values):
        raise ElasticStateError(f"KerasState: the {what} has {len(variables)} variables, the "
                                f"commit holds {len(values)}; was the model changed?")
    for var, value in zip(variables, values):
        if tuple(var.shape) != value.shape:
            raise ElasticStateError(f"KerasState: {what} variable {var.path} has shape "
                                    f"{tuple(var.shape)}, the commit holds {value.shape}")
        var.assign(value)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` batches and at the end
    of every epoch (the last batch of an epoch commits once, at its end)."""

    def __init__(self, state: State, batches_per_commit: int = 1):
        super().__init__()
        self.state = state
        self.batches_per_commit = positive_count(batches_per_commit, "batches_per_commit")
        self._since_commit = 0

    def on_train_batch_end(self, batch, logs=None):
        self._since_commit += 1
        last = (self.params or {}).get("steps") == batch + 1
        if self._since_commit >= self.batches_per_commit and not last:
            self._commit()

    def on_epoch_end(self, epoch, logs=None):
        self._commit()

    def _commit(self):
        self.state.commit()
        self._since_commit = 0


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` = the number of batches of the current epoch
    done, counting those done before a restart (a fit() that starts with
    ``state.batch`` = k is taken to start at the epoch's batch k); 0 after
    each epoch."""

    def __init__(self, state: State):
        super().__init__()
        self.state = state
        self._offset = 0

    def on_train_begin(self, logs=None):
        self._offset = self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = self._offset + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0
        self._offset = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Sets ``state.epoch`` to the number of epochs done at each epoch end."""

    def __init__(self, state: State):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = epoch + 1

"""Keras callbacks for data-parallel training (Horovod's
horovod.tensorflow.keras.callbacks): BroadcastGlobalVariablesCallback,
MetricAverageCallback, LearningRateScheduleCallback,
LearningRateWarmupCallback, BestModelCheckpoint."""
from __future__ import annotations

import numbers
import warnings

import keras
import numpy as np

import commlib

from ..collectives.state_sync import broadcast_variables
from ..gradient_tape import var_key


def _optimizer_variables(optimizer):
    if optimizer is None:
        return []
    v = optimizer.variables
    return list(v() if callable(v) else v)


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank start from rank ``root_rank``'s model and optimizer
    state: broadcasts ``model.variables`` and the optimizer's variables when
    training begins, and once more after the first batch if the optimizer
    created its variables only then. ``local_variables`` (a variable or a
    list of them, e.g. the weights of a DistributedOptimizer's local_layers)
    keep each rank's own values."""

    def __init__(self, root_rank, device='', local_variables=None):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self._n_optimizer_vars = -1
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        self._local = {var_key(v) for v in local_variables}

    def _broadcast(self):
        opt_vars = _optimizer_variables(getattr(self.model, "optimizer", None))
        shared = [v for v in list(self.model.variables) + opt_vars if var_key(v) not in self._local]
        broadcast_variables(shared, root_rank=self.root_rank)
        self._n_optimizer_vars = len(opt_vars)

    def on_train_begin(self, logs=None):
        if not self.broadcast_done:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        n = len(_optimizer_variables(getattr(self.model, "optimizer", None)))
        if n != self._n_optimizer_vars:
            self._broadcast()
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces every numeric entry of the epoch-end logs (loss, metrics,
    validation metrics) by its average over ranks, so that later callbacks
    (History, ProgbarLogger, checkpointing, early stopping, ReduceLROnPlateau)
    see global values. Put it before the callbacks that read the metrics."""

    def __init__(self, device=''):
        super().__init__()
        self.device = device

    @staticmethod
    def _average_metrics_in_place(logs):
        if not logs:
            return
        keys = sorted(k for k, v in logs.items()
                      if isinstance(v, (numbers.Number, np.number, np.ndarray))
                      and np.size(v) == 1 and not isinstance(v, bool))
        if not keys:
            return
        values = [np.asarray(logs[k], dtype=np.float64).reshape(1) for k in keys]
        averaged = commlib.grouped_allreduce(values, op=commlib.Average)
        for k, v in zip(keys, averaged):
            logs[k] = float(v[0])

    def on_epoch_end(self, epoch, logs=None):
        self._average_metrics_in_place(logs)


def _get_lr(optimizer):
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _set_lr(optimizer, value):
    optimizer.learning_rate = value


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` between
    ``start_epoch`` and ``end_epoch`` (per epoch when ``staircase``, else per
    batch with fractional epochs). ``multiplier`` is a function of the epoch or
    a constant (exponential decay). ``momentum_correction`` scales the
    momentum by new_lr/old_lr for the batch where the rate changes, when the
    optimizer's momentum is a variable (Keras 3's SGD compiles its float
    momentum into the train step, so it is left alone there)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.initial_lr = initial_lr
        self.restore_momentum = None
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self._warned_momentum = False
        if not callable(multiplier):
            self.multiplier = lambda epoch: multiplier ** epoch
        else:
            self.multiplier = multiplier
        if self.initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")

    def _autodetect_steps_per_epoch(self):
        if self.params.get("steps"):
            return self.params["steps"]
        if self.params.get("samples") and self.params.get("batch_size"):
            return self.params["samples"] // self.params["batch_size"]
        raise ValueError("Could not autodetect the number of steps per epoch. Please specify the "
                         f"steps_per_epoch parameter to the {type(self).__name__}().")

    def _adjust_learning_rate(self, epoch):
        opt = self.model.optimizer
        old_lr = _get_lr(opt)
        new_lr = self.initial_lr * self.multiplier(epoch)
        _set_lr(opt, new_lr)
        momentum = getattr(opt, "momentum", None)
        if self.momentum_correction and momentum is not None and old_lr > 0:
            if hasattr(momentum, "assign"):
                self.restore_momentum = float(keras.ops.convert_to_numpy(momentum))
                momentum.assign(self.restore_momentum * new_lr / old_lr)
            elif momentum and not self._warned_momentum:
                self._warned_momentum = True
                warnings.warn("momentum correction skipped: the optimizer's momentum is a "
                              "Python float compiled into the train step")

    def _restore_momentum_if_needed(self):
        if self.restore_momentum is not None:
            self.model.optimizer.momentum.assign(self.restore_momentum)
            self.restore_momentum = None

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = _get_lr(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.current_epoch < self.start_epoch or
                (self.end_epoch is not None and self.current_epoch >= self.end_epoch)):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from ``initial_lr / size`` to ``initial_lr``
    over ``warmup_epochs`` epochs, per batch (Goyal et al., "Accurate, Large
    Minibatch SGD"), as Horovod's: lr = initial_lr / size * (e * (size - 1) /
    warmup_epochs + 1) at fractional epoch e (counted at the batch's end)."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                 steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch
            n = commlib.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and commlib.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_get_lr(self.model.optimizer):g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Saves the model to ``filepath`` (a ``.keras`` file; ``{epoch}`` and
    the logs' keys may appear in it, as in ModelCheckpoint) whenever the
    monitored metric improves, on rank 0 only (the ranks hold the same
    model: one writer is enough, and no rank needs ``if hvd.rank() == 0``).
    Put MetricAverageCallback before it to compare the metric averaged over
    ranks rather than rank 0's own."""

    def __init__(self, filepath=None, monitor="val_loss", verbose=0, mode="auto",
                 save_freq="epoch"):
        if filepath is None:
            raise ValueError("BestModelCheckpoint needs a filepath (a .keras file)")
        super().__init__(filepath=filepath, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=False, mode=mode, save_freq=save_freq)

    def on_train_batch_end(self, batch, logs=None):
        if commlib.rank() == 0:
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if commlib.rank() == 0:
            super().on_epoch_end(epoch, logs)

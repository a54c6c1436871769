"""commlib.keras.elastic on every rank: a Keras model trained with Adam
through DistributedOptimizer by model.fit, EPOCHS epochs of BATCHES batches,
with UpdateBatchStateCallback, UpdateEpochStateCallback and
CommitStateCallback(batches_per_commit=COMMIT_EVERY) inside
@hvd.elastic.run. Each fit() starts at the batch the state says is next.
Planned self-kills (see _elastic_kills) make ``commlibrun --restarts`` start
the job again. The attempt that finishes then fits a second model without
interruption and prints the largest difference of model and optimizer
variables between the two.
"""
import os

from tf_common import done, fail, same_on_all_ranks  # first: it sets TF's options

import keras
import numpy as np

import commlib.keras as hvd  # Horovod users write horovod.keras
import _elastic_kills as kills

EPOCHS, BATCHES, B, COMMIT_EVERY = 3, 8, 8, 3
r = hvd.rank()


def data(epoch):
    rng = np.random.default_rng((epoch, r))
    x = rng.normal(size=(BATCHES * B, 6)).astype(np.float32)
    return x, np.sin(3 * x[:, :2])


def make():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((6,)),
                              keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    return model


def flat(model):
    return np.concatenate([keras.ops.convert_to_numpy(v).ravel()
                           for v in list(model.variables) + list(model.optimizer.variables)])


model = make()
state = hvd.elastic.KerasState(model, epoch=0, batch=0)


class Kills(keras.callbacks.Callback):
    """Runs the planned kills; placed before CommitStateCallback."""

    def __init__(self, first):
        super().__init__()
        self.first = first

    def on_train_batch_begin(self, batch, logs=None):
        kills.at_step(state.epoch * BATCHES + state.batch)

    def on_train_batch_end(self, batch, logs=None):
        self.first.done()
        kills.set_step(state.epoch * BATCHES + state.batch)

    def on_epoch_end(self, epoch, logs=None):
        kills.set_step(state.epoch * BATCHES)


@hvd.elastic.run
def train(state):
    first = kills.FirstStep(state.epoch * BATCHES + state.batch)
    callbacks = [hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state), Kills(first),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=COMMIT_EVERY)]
    for epoch in range(state.epoch, EPOCHS):
        x, y = data(epoch)
        skip = state.batch * B
        model.fit(x[skip:], y[skip:], batch_size=B, shuffle=False, initial_epoch=epoch,
                  epochs=epoch + 1, callbacks=callbacks, verbose=0)


train(state)
# Per epoch: commits after batches 3 and 6, and at the epoch's end.
commits = 3 * EPOCHS if os.environ.get("COMMLIB_ELASTIC_DIR") else 0
if (state.epoch, state.batch, state.commit_number) != (EPOCHS, 0, commits):
    fail(f"ended at epoch {state.epoch}, batch {state.batch}, commit {state.commit_number}")
if int(model.optimizer.iterations) != EPOCHS * BATCHES:
    fail(f"optimizer iterations {int(model.optimizer.iterations)} != {EPOCHS * BATCHES}")
reference = make()
for epoch in range(EPOCHS):
    reference.fit(*data(epoch), batch_size=B, shuffle=False, initial_epoch=epoch,
                  epochs=epoch + 1, verbose=0)
got = flat(model)
same_on_all_ranks([got], "final model and optimizer variables")
print(f"rank {r}: max difference from an uninterrupted run: "
      f"{float(np.abs(got - flat(reference)).max())!r}")
done()

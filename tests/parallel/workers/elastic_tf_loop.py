"""commlib.tensorflow.elastic on every rank (Horovod's horovod.tensorflow.elastic).

1. TensorFlowState over a tf.Variable and a Keras variable (first attempt
   only, its commits in a directory of their own): sync() gives every rank
   rank 0's values and user state, restore() returns to the last sync or
   commit, load_last_commit() refuses (ElasticStateError, on every rank) a
   commit of another number of variables or of another shape; bad
   arguments raise.
2. A custom loop: a tf.function step through DistributedGradientTape and SGD
   with momentum, STEPS steps, a commit every COMMIT_EVERY, inside
   @hvd.elastic.run with TensorFlowKerasState(model, optimizer). Planned
   self-kills (_elastic_kills) make ``commlibrun --restarts`` start the job
   again. The attempt that finishes trains a second model without
   interruption and prints the largest difference of model and optimizer
   variables between the two.
"""
import os

from tf_common import done, expect_raises, fail, same_on_all_ranks  # first: it sets TF's options

import keras
import numpy as np
import tensorflow as tf

import commlib.tensorflow as hvd
import _elastic_kills as kills
from _common import check_equal

STEPS, COMMIT_EVERY, B = 12, 3, 8
r = hvd.rank()
attempt = int(os.environ.get("COMMLIB_RESTART", "0"))

# 1. TensorFlowState
if attempt == 0:
    commits = os.environ["COMMLIB_ELASTIC_DIR"]
    os.environ["COMMLIB_ELASTIC_DIR"] = os.path.join(os.environ["ELASTIC_MARKERS"], "tf_state")
    v1 = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * r)
    v2 = keras.Variable(np.full(4, float(r)), dtype="float64")
    state = hvd.elastic.TensorFlowState([v1, v2], step=r)
    state.sync()
    check_equal(v1.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3), "sync: rank 0's tf.Variable")
    check_equal(keras.ops.convert_to_numpy(v2), np.zeros(4), "sync: rank 0's Keras variable")
    if state.step != 0:
        fail(f"sync: user state step {state.step}, rank 0's is 0")
    v1.assign(tf.fill((2, 3), -1.0))
    state.restore()
    check_equal(v1.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3), "restore after sync")
    v1.assign(tf.fill((2, 3), 7.0))
    state.step = 5
    state.commit()
    v1.assign(tf.fill((2, 3), -1.0))
    v2.assign(np.ones(4))
    state.step = 6
    state.restore()
    check_equal(v1.numpy(), np.full((2, 3), 7.0, np.float32), "restore after commit")
    check_equal(keras.ops.convert_to_numpy(v2), np.zeros(4), "restore after commit (Keras variable)")
    if state.step != 5:
        fail(f"restore: user state step {state.step}, committed 5")
    fewer = hvd.elastic.TensorFlowState([v1])
    expect_raises(hvd.elastic.ElasticStateError, fewer.load_last_commit,
                  "a commit of 2 variables, 1 held", match="holds 1 variables, the commit 2")
    other = hvd.elastic.TensorFlowState([tf.Variable(np.zeros((3, 2), np.float32)), v2])
    expect_raises(hvd.elastic.ElasticStateError, other.load_last_commit, "a commit of another shape",
                  match="has shape (3, 2), the commit holds (2, 3)")
    expect_raises(ValueError, hvd.elastic.TensorFlowState, "no variables", match="needs the variables")
    expect_raises(TypeError, lambda: hvd.elastic.TensorFlowState([np.zeros(2)]), "a numpy array",
                  match="not a tf.Variable")
    expect_raises(NotImplementedError, lambda: hvd.elastic.TensorFlowState([v1], session=object()),
                  "a TF1 session", match="sessions")
    os.environ["COMMLIB_ELASTIC_DIR"] = commits


# 2. A custom loop that is killed and resumes
def batch(step):
    rng = np.random.default_rng((step, r))
    x = rng.normal(size=(B, 5)).astype(np.float32)
    return x, np.sin(2 * x[:, :2])


def make():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(2)])
    opt = keras.optimizers.SGD(0.05, momentum=0.9)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    return model, opt, train_step


def flat(model, opt):
    return np.concatenate([keras.ops.convert_to_numpy(v).ravel()
                           for v in list(model.variables) + list(opt.variables)])


model, opt, train_step = make()
state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)


@hvd.elastic.run
def train(state):
    kills.train_steps(state, STEPS, COMMIT_EVERY, lambda step: train_step(*batch(step)))


train(state)
if (state.step, state.commit_number) != (STEPS, STEPS // COMMIT_EVERY):
    fail(f"ended at step {state.step}, commit {state.commit_number}")
if int(opt.iterations) != STEPS:
    fail(f"optimizer iterations {int(opt.iterations)} != {STEPS}")
ref_model, ref_opt, ref_step = make()
for step in range(STEPS):
    ref_step(*batch(step))
got = flat(model, opt)
same_on_all_ranks([got], "final model and optimizer variables")
print(f"rank {r}: max difference from an uninterrupted run: "
      f"{float(np.abs(got - flat(ref_model, ref_opt)).max())!r}")
done()

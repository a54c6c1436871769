"""Compression.powersgd(...) in the Keras DistributedOptimizer and in
DistributedGradientTape, on every rank: 20 steps of a small float64 MLP
(start_step a few steps in) match a float64 simulation of PowerSGD written
here independently in numpy (every rank's gradients backpropagated in this
process from every rank's data, the rule, Keras' SGD) within 1e-9, and the replicas are
bitwise identical after every step. Variants: the optimizer in
train_on_batch (a traced step: the start is a tf.cond) and with
backward_passes_per_step=2; the tape in a tf.function and eagerly with a
cold start (the random Q seeded by the step) and no error feedback; at 3
ranks, the optimizer over the process sets {0, 2} and {1, 2} (members match
the simulation on their data, the rank outside trains alone). A
checkpoint after step 7 (save_weights with the optimizer, model.save read
back by hvd.load_model; the tape's ``psgd.variables``) restored into a fresh
model continues bitwise as the uninterrupted run, and so does an elastic
KerasState restored and synced from rank 0 (each rank keeps its own errors). Keras mixed precision (mixed_bfloat16, mixed_float16 with a
LossScaleOptimizer) trains with identical replicas. Refused: ZeRO, staleness, groups, Adasum, a tape given
the class, sparse gradients, different ranks across ranks. Given a trace
path, it also counts a step's bytes (tf_powersgd_bytes.py)."""
import os
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf
from powersgd_reference import exchange
from tf_common import done, expect_raises, fail, hvd, same_on_all_ranks

from commlib import CollectiveMismatchError
from commlib.tensorflow.keras import load_model

r, n = hvd.rank(), hvd.size()
B, STEPS, LR, MOMENTUM, TOL = 8, 20, 0.1, 0.9, 1e-9
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, dtype="float64")
INIT = [np.random.default_rng(7 + i).standard_normal(s) * 0.4
        for i, s in enumerate([(10, 32), (32,), (32, 16), (16,), (16, 4), (4,)])]


def mlp():
    # 10x32 and 32x16 kernels shrink >= 2x at rank 2; the 16x4 head and the biases do not
    model = keras.Sequential([keras.Input((10,), dtype="float64"),
                              keras.layers.Dense(32, "tanh", dtype="float64"),
                              keras.layers.Dense(16, "tanh", dtype="float64"),
                              keras.layers.Dense(4, dtype="float64")])
    model.set_weights(INIT)
    return model


def sgd():
    return keras.optimizers.SGD(LR, momentum=MOMENTUM)


def batch(step, micro=0):
    """The combined batch of all ranks (the same on every rank)."""
    g = np.random.default_rng(1000 + 10 * step + micro)
    return g.standard_normal((n * B, 10)), g.integers(0, 4, n * B)


def part(a, k):
    return a[k * B:(k + 1) * B]


# ------------------------------------------------------------ the simulation


def gradients(weights, x, y):
    """The MLP's gradients of the mean cross entropy, backpropagated in numpy."""
    w0, b0, w1, b1, w2, b2 = weights
    h1 = np.tanh(x @ w0 + b0)
    h2 = np.tanh(h1 @ w1 + b1)
    z = h2 @ w2 + b2
    p = np.exp(z - z.max(1, keepdims=True))
    dz = (p / p.sum(1, keepdims=True) - np.eye(4)[y]) / len(y)
    d2 = (dz @ w2.T) * (1 - h2 ** 2)
    d1 = (d2 @ w1.T) * (1 - h1 ** 2)
    return [x.T @ d1, d1.sum(0), h1.T @ d2, d2.sum(0), h2.T @ dz, dz.sum(0)]


def simulate(rank, start, warm=True, feedback=True, passes=1, seed=0, members=None):
    """The weights after every step of PowerSGD training on all ranks' data
    (or the data of the ranks ``members``), with Keras' SGD rule (it casts the
    learning rate and momentum from float32)."""
    members = list(range(n)) if members is None else members
    weights = [w.copy() for w in INIT]
    velocity = [np.zeros_like(w) for w in INIT]
    lr, momentum = float(np.float32(LR)), float(np.float32(MOMENTUM))
    errors, qs, history = [{} for _ in members], {}, []
    for step in range(STEPS):
        grads = []
        for k in members:
            parts = [gradients(weights, part(x, k), part(y, k))
                     for x, y in (batch(step, micro) for micro in range(passes))]
            grads.append([np.sum(gs, 0) for gs in zip(*parts)])
        new = exchange([dict(enumerate(g)) for g in grads], errors, qs, step, rank, start, warm,
                       feedback, seed=seed)
        new = [new[i] for i in range(len(weights))]
        for w, v, g in zip(weights, velocity, new):
            v *= momentum
            v -= lr * g
            w += v
        history.append([w.copy() for w in weights])
    return history


# ------------------------------------------------------------ the distributed runs


def fit_step(model, step, passes=1):
    for micro in range(passes):
        x, y = batch(step, micro)
        model.train_on_batch(part(x, r), part(y, r))


def keras_run(psgd, passes=1, process_set=None):
    model = mlp()
    model.compile(optimizer=hvd.DistributedOptimizer(sgd(), compression=psgd,
                                                     backward_passes_per_step=passes,
                                                     process_set=process_set),
                  loss=LOSS, jit_compile=False)
    return model, lambda step: fit_step(model, step, passes)


def tape_run(psgd, passes=1, graph=True):
    model, opt = mlp(), sgd()

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x))
        tape = hvd.DistributedGradientTape(tape, compression=psgd)
        grads = tape.gradient(loss, model.trainable_weights)
        opt.apply(grads, model.trainable_weights)

    fn = tf.function(step_fn) if graph else step_fn

    def step(s):
        x, y = batch(s)
        fn(tf.constant(part(x, r)), tf.constant(part(y, r)))
    model.opt = opt
    return model, step


def check_against_simulation(what, make, cfg, passes=1, **run_kwargs):
    """Returns the model after the 20 steps."""
    model, step = make(hvd.Compression.powersgd(**cfg), passes=passes, **run_kwargs)
    history = simulate(cfg["rank"], cfg["start_step"], cfg.get("warm_start", True),
                       cfg.get("error_feedback", True), passes)
    worst = 0.0
    for s in range(STEPS):
        step(s)
        got = model.get_weights()
        same_on_all_ranks(got, f"{what}: step {s}")
        for i, (g, w) in enumerate(zip(got, history[s])):
            err = float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-12))
            worst = max(worst, err)
            if err > TOL:
                fail(f"{what}: weight {i} after step {s} differs from the simulation by "
                     f"{err:.2e} (relative to its largest element)")
    print(f"rank {r}: {what}: max relative difference from the simulation {worst:.2e}",
          flush=True)
    return model


default = dict(rank=2, start_step=4)
whole_keras = check_against_simulation("optimizer", keras_run, default)
check_against_simulation("optimizer, 2 passes per step", keras_run, default, passes=2)
whole_tape = check_against_simulation("tape in tf.function", tape_run, default)
check_against_simulation("tape eager, cold, no feedback, rank 1", tape_run,
                         dict(rank=1, start_step=3, warm_start=False, error_feedback=False),
                         graph=False)

# The simulation is not plain averaging after start_step: the compression is visible.
if np.abs(simulate(2, STEPS)[-1][0] - simulate(2, 4)[-1][0]).max() < 1e-4:
    fail("PowerSGD's simulation equals plain averaging: the check would not see compression")

# ------------------------------------------------------------ process sets (3 ranks)


def check_process_set(members):
    """The Keras optimizer over a process set: its members match the
    simulation on their data, bitwise identical; the rank outside trains alone."""
    ps = hvd.add_process_set(members)
    member = r in members
    model, step = keras_run(hvd.Compression.powersgd(**default), process_set=ps)
    history = simulate(2, 4, members=members) if member \
        else simulate(2, STEPS, members=[r])  # (alone: plain local steps)
    worst = 0.0
    for s in range(STEPS):
        step(s)
        got = model.get_weights()
        worst = max([worst] + [float(np.abs(g - w).max() / np.abs(w).max())
                               for g, w in zip(got, history[s])])
        if member:
            mine = b"".join(a.tobytes() for a in got)
            if any(x != mine for x in hvd.allgather_object(mine, process_set=ps)):
                fail(f"process set {members}: members differ bitwise after step {s}")
    print(f"rank {r}: process set {members}: max relative difference from its simulation "
          f"{worst:.2e}", flush=True)
    if worst > TOL:
        fail(f"process set {members}: rank {r} differs from the simulation by {worst:.2e}")
    hvd.remove_process_set(ps)


if n == 3:
    check_process_set([0, 2])
    check_process_set([1, 2])

# ------------------------------------------------------------ checkpoints



def same_as(model, whole, what):
    for i, (a, b) in enumerate(zip(model.get_weights(), whole.get_weights())):
        if not np.array_equal(a, b):
            fail(f"{what}: weight {i} after the restart differs from the uninterrupted run by "
                 f"{np.abs(a - b).max():.2e}")


tmp = tempfile.mkdtemp(prefix=f"commlib_tf_powersgd_{r}_")
model, step = keras_run(hvd.Compression.powersgd(**default))
for s in range(7):
    step(s)
path = os.path.join(tmp, "ckpt.weights.h5")
model.save_weights(path)
model.save(os.path.join(tmp, "model.keras"))
model, step = keras_run(hvd.Compression.powersgd(**default))
model.set_weights([w * 0 for w in INIT])
model.optimizer.build(model.trainable_variables)
model.load_weights(path)
for s in range(7, STEPS):
    step(s)
same_as(model, whole_keras, "optimizer checkpoint")
# hvd.load_model: the PowerSGD optimizer and its state come back from the saved configuration
model = load_model(os.path.join(tmp, "model.keras"))
model.compile(optimizer=model.optimizer, loss=LOSS, jit_compile=False)  # (the float64 loss)
for s in range(7, STEPS):
    fit_step(model, s)
same_as(model, whole_keras, "load_model")
expect_raises(ValueError, lambda: load_model(os.path.join(tmp, "model.keras"),
                                             compression=hvd.Compression.powersgd(rank=1)),
              "load_model with another configuration", match="cannot be loaded")
other, _ = keras_run(hvd.Compression.powersgd(rank=1, start_step=4))
other.optimizer.build(other.trainable_variables)
expect_raises(ValueError, lambda: other.load_weights(path), "other configuration",
              match="cannot be loaded")

# elastic: a commit at step 7, then what a restart does (restore the commit,
# then sync() from rank 0, as elastic.run): PowerSGD's state is committed and
# the error buffers stay each rank's own, so the run continues exactly
from commlib.tensorflow.keras.elastic import KerasState

model, step = keras_run(hvd.Compression.powersgd(**default))
state = KerasState(model)
for s in range(7):
    step(s)
state.commit()
for s in range(7, 10):
    step(s)
state.restore()
state.sync()
for s in range(7, STEPS):
    step(s)
same_as(model, whole_keras, "elastic restore and sync")

psgd = hvd.Compression.powersgd(**default)
model, step = tape_run(psgd)
for s in range(7):
    step(s)
saved = [v.numpy() for v in psgd.variables + model.opt.variables] + model.get_weights()
psgd = hvd.Compression.powersgd(**default)
model, step = tape_run(psgd)
psgd.build(model.trainable_weights)
model.opt.build(model.trainable_weights)
for v, a in zip(psgd.variables + model.opt.variables, saved):
    v.assign(a)
model.set_weights(saved[-len(INIT):])
for s in range(7, STEPS):
    step(s)
same_as(model, whole_tape, "tape checkpoint")

# ------------------------------------------------------------ mixed precision

def mixed_precision_run(policy):
    """Keras mixed precision (float32 variables, half compute; mixed_float16
    with a LossScaleOptimizer): PowerSGD compresses the float32 gradients,
    the replicas stay identical and the loss falls."""
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, "tanh"),
                                  keras.layers.Dense(16, "tanh"), keras.layers.Dense(4, dtype="float32")])
        opt = keras.optimizers.SGD(0.1)
        if policy == "mixed_float16":
            opt = keras.mixed_precision.LossScaleOptimizer(opt)
        model.compile(hvd.DistributedOptimizer(opt, compression=hvd.Compression.powersgd(rank=2, start_step=1)),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        g = np.random.default_rng(r)
        x, y = g.standard_normal((64, 10)).astype("float32"), g.integers(0, 4, 64)
        same_on_all_ranks(model.get_weights(), f"{policy} initial weights (one seed)")
        losses = model.fit(x, y, batch_size=8, epochs=3, verbose=0).history["loss"]
        if not (np.all(np.isfinite(losses)) and losses[-1] < losses[0]):
            fail(f"{policy}: the loss did not fall: {losses}")
        same_on_all_ranks([w.astype(np.float64) for w in model.get_weights()], f"{policy} replicas")
    finally:
        keras.mixed_precision.set_global_policy("float32")


for policy in ("mixed_bfloat16", "mixed_float16"):
    mixed_precision_run(policy)

# ------------------------------------------------------------ refused combinations

psgd = hvd.Compression.powersgd()
for kwargs, match in [(dict(zero_stage=1), "zero_stage"), (dict(staleness=1), "staleness"),
                      (dict(groups=2), "groups"), (dict(op=hvd.Adasum), "op=Average")]:
    expect_raises(ValueError, lambda: hvd.DistributedOptimizer(sgd(), compression=psgd,
                                                               **kwargs),
                  f"optimizer {kwargs}", match=match)
with tf.GradientTape() as tape:
    pass
expect_raises(ValueError, lambda: hvd.DistributedGradientTape(
    tape, compression=hvd.Compression.powersgd), "tape given the class", match="created once")
emb = keras.layers.Embedding(50, 8)
emb.build((None,))
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(emb(tf.constant([r, 3 + r])))
grads = hvd.DistributedGradientTape(tape, compression=hvd.Compression.powersgd(start_step=0))
expect_raises(ValueError, lambda: grads.gradient(loss, emb.trainable_weights), "sparse",
              match="sparse_as_dense=True")
model, step = keras_run(hvd.Compression.powersgd(rank=1 if r == 0 else 2))
expect_raises(CollectiveMismatchError, lambda: step(0), "rank differs across ranks",
              match="PowerSGD")

if len(sys.argv) > 1:  # a trace path: count the bytes of a step (tf_powersgd_bytes.py)
    import tf_powersgd_bytes

    tf_powersgd_bytes.check(sys.argv[1])
done()

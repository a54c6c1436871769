"""commlib.tensorflow.keras with Keras 3: model.fit with DistributedOptimizer
on N ranks x batch B ends where one process fitting the N*B batches ends
(SGD, Adam, sparse embedding gradients, steps_per_execution, run_eagerly),
weights bitwise equal across ranks; backward_passes_per_step; callbacks
(broadcast, metric averaging, learning-rate warmup, the best model saved by
rank 0 alone); load_model;
mixed_float16; local_layers with BroadcastGlobalVariablesCallback(local_variables=),
imported as commlib.keras (Horovod users write horovod.keras)."""
import os
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf
from tf_common import check, done, fail, max_rel_err, same_on_all_ranks

import commlib.keras as hvd  # the name Horovod users write (horovod.keras)

r, n = hvd.rank(), hvd.size()
B, STEPS, D_IN = 8, 6, 10
rng = np.random.default_rng(99)
X = rng.normal(size=(4 * STEPS * n * B, D_IN)).astype(np.float32)
Y = (np.sin(X[:, :1]) + 0.1 * rng.normal(size=(len(X), 1))).astype(np.float32)


def local_rows(steps, k=1):
    """Rank r's rows: at local step u*k + j it takes block (j, r) of global
    batch u (k*n blocks of B rows)."""
    idx = []
    for u in range(steps // k):
        for j in range(k):
            lo = u * n * k * B + (j * n + r) * B
            idx.extend(range(lo, lo + B))
    return X[idx], Y[idx]


def make_model(seed, layers=None):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.layers.Input((D_IN,)),
                             keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(1)])


def fit_pair(opt_fn, steps=STEPS, epochs=2, k=1, lr_scale=1.0, **dist_kw):
    """(distributed model, reference model) after fitting."""
    model, ref = make_model(seed=5), make_model(seed=5)
    model.compile(optimizer=hvd.DistributedOptimizer(opt_fn(1.0), backward_passes_per_step=k,
                                                     **dist_kw), loss="mse")
    ref.compile(optimizer=opt_fn(lr_scale), loss="mse")
    x, y = local_rows(steps, k)
    model.fit(x, y, batch_size=B, epochs=epochs, shuffle=False, verbose=0)
    gx, gy = X[:steps * n * B], Y[:steps * n * B]
    ref.fit(gx, gy, batch_size=n * k * B, epochs=epochs, shuffle=False, verbose=0)
    return model, ref


errors = {}
for name, opt_fn in (("SGD", lambda s: keras.optimizers.SGD(0.05 * s)),
                     ("Adam", lambda s: keras.optimizers.Adam(0.01 * s))):
    model, ref = fit_pair(opt_fn)
    same_on_all_ranks(model.get_weights(), f"fit {name} weights")
    errors[f"fit {name}"] = max_rel_err(model.get_weights(), ref.get_weights())
    if int(model.optimizer.iterations.numpy()) != 2 * STEPS:
        fail(f"{name}: iterations {model.optimizer.iterations.numpy()} != {2 * STEPS}")

# backward_passes_per_step k: reduce+apply every k batches (summed, or averaged)
sgd = (lambda s: keras.optimizers.SGD(0.05 * s))
for avg in (True, False):
    model, ref = fit_pair(sgd, k=2, lr_scale=1.0 if avg else 2.0,
                          average_aggregated_gradients=avg)
    same_on_all_ranks(model.get_weights(), f"backward_passes_per_step avg={avg}")
    errors[f"backward_passes_per_step=2 avg={avg}"] = max_rel_err(model.get_weights(),
                                                                  ref.get_weights())
    if int(model.optimizer.iterations.numpy()) != 2 * STEPS:  # counts batches, as Horovod
        fail(f"backward_passes_per_step: iterations {model.optimizer.iterations.numpy()}")
# Its saved optimizer state is the wrapped optimizer's (the accumulators are
# not part of it), so load_model's plain optimizer loads it whole.
path = os.path.join(tempfile.mkdtemp(prefix=f"commlib_tf_bpps_{r}_"), "model.keras")
model.save(path)
if int(hvd.load_model(path).optimizer.iterations.numpy()) != 2 * STEPS:
    fail("load_model lost the state of an optimizer with backward_passes_per_step")

# steps_per_execution: the train step runs inside a tf.while_loop
model, ref = make_model(seed=5), make_model(seed=5)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse",
              steps_per_execution=3)
ref.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
x, y = local_rows(STEPS)
model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
ref.fit(X[:STEPS * n * B], Y[:STEPS * n * B], batch_size=n * B, epochs=1, shuffle=False,
        verbose=0)
same_on_all_ranks(model.get_weights(), "steps_per_execution")
errors["steps_per_execution=3"] = max_rel_err(model.get_weights(), ref.get_weights())

# run_eagerly: the optimizer reduces eagerly (accumulating too)
for k in (1, 2):
    model, ref = make_model(seed=5), make_model(seed=5)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                                     backward_passes_per_step=k,
                                                     average_aggregated_gradients=True),
                  loss="mse", run_eagerly=True)
    ref.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    x, y = local_rows(4, k)
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    ref.fit(X[:4 * n * B], Y[:4 * n * B], batch_size=n * k * B, epochs=1, shuffle=False,
            verbose=0)
    same_on_all_ranks(model.get_weights(), f"run_eagerly k={k}")
    errors[f"run_eagerly backward_passes_per_step={k}"] = max_rel_err(model.get_weights(),
                                                                      ref.get_weights())

# an embedding's IndexedSlices gradients (allgathered) inside model.fit
ids = np.random.default_rng(3).integers(0, 20, size=(len(X), 3))


def emb_model():
    keras.utils.set_random_seed(11)
    return keras.Sequential([keras.layers.Input((3,), dtype="int32"),
                             keras.layers.Embedding(20, 4), keras.layers.Flatten(),
                             keras.layers.Dense(1)])


for sparse_as_dense in (False, True):
    model, ref = emb_model(), emb_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                                     sparse_as_dense=sparse_as_dense),
                  loss="mse")
    ref.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    sel = [i for t in range(STEPS) for i in range(t * n * B + r * B, t * n * B + (r + 1) * B)]
    model.fit(ids[sel], Y[sel], batch_size=B, epochs=1, shuffle=False, verbose=0)
    ref.fit(ids[:STEPS * n * B], Y[:STEPS * n * B], batch_size=n * B, epochs=1, shuffle=False,
            verbose=0)
    same_on_all_ranks(model.get_weights(), f"embedding sparse_as_dense={sparse_as_dense}")
    errors[f"embedding sparse_as_dense={sparse_as_dense}"] = max_rel_err(model.get_weights(),
                                                                         ref.get_weights())

worst = max(errors.values())
print(f"rank {r}: keras equivalence max relative error {worst:.3g} "
      + ", ".join(f"{k}: {v:.2g}" for k, v in errors.items()), flush=True)
if worst > 1e-5:
    fail(f"model.fit with DistributedOptimizer differs from single-process training: {errors}")


# ---------------------------------------------------------------- callbacks

class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.first_weights = None
        self.lrs = []
        self.epoch_logs = []

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_weights is None:
            self.first_weights = self.model.get_weights()
        self.lrs.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


model = make_model(seed=1000 + r)  # different initial weights on every rank
initial_root = hvd.broadcast_object(model.get_weights(), root_rank=0)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
              loss="mse", metrics=["mae"])
raw, averaged = Recorder(), Recorder()
x = X[:STEPS * B] + r  # different data per rank: different local losses
y = Y[:STEPS * B] * (r + 1)
warmup_epochs = 2
best_dir = hvd.broadcast_object(tempfile.mkdtemp(prefix="commlib-best-") if r == 0 else None, 0)
best = hvd.callbacks.BestModelCheckpoint(os.path.join(best_dir, f"rank{r}.epoch{{epoch}}.keras"),
                                         monitor="val_loss")
with __import__("warnings").catch_warnings():
    __import__("warnings").simplefilter("ignore")
    hist = model.fit(x, y, batch_size=B, epochs=3, shuffle=False, verbose=0,
                     validation_data=(x[:B], y[:B]),
                     callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                hvd.callbacks.LearningRateWarmupCallback(
                                    initial_lr=0.1, warmup_epochs=warmup_epochs),
                                raw, hvd.callbacks.MetricAverageCallback(), averaged, best])
for a, b in zip(raw.first_weights, initial_root):
    check(a, b, "weights after BroadcastGlobalVariablesCallback")
same_on_all_ranks(model.get_weights(), "callbacks: weights after fit")
everyone = hvd.allgather_object(raw.epoch_logs)
for e, logs in enumerate(averaged.epoch_logs):
    for key in ("loss", "mae", "val_loss", "val_mae"):
        want = np.mean([everyone[s][e][key] for s in range(n)])
        if abs(logs[key] - want) > 1e-6 * max(1.0, abs(want)):
            fail(f"MetricAverageCallback: epoch {e} {key} {logs[key]} != mean {want}")
    if abs(hist.history["loss"][e] - logs["loss"]) > 1e-12:
        fail("History did not receive the averaged loss")
same_on_all_ranks([np.array(hist.history["loss"]), np.array(hist.history["val_loss"])],
                  "History")
want_lrs = []
for e in range(3):
    for b in range(STEPS):
        if e < warmup_epochs:
            epoch = e + b / STEPS + 1 / STEPS
            want_lrs.append(0.1 / n * (epoch * (n - 1) / warmup_epochs + 1))
        else:
            want_lrs.append(want_lrs[-1])
check(np.array(averaged.lrs), np.array(want_lrs), "LearningRateWarmupCallback", rtol=1e-6)
# BestModelCheckpoint: rank 0 alone saves, at each epoch whose averaged val_loss is a new best.
val = [logs["val_loss"] for logs in averaged.epoch_logs]
improved = [e + 1 for e in range(len(val)) if val[e] < min(val[:e], default=np.inf)]
hvd.allgather_object(r)  # (a barrier: rank 0 has saved)
saved = sorted(os.listdir(best_dir))
want_files = sorted(f"rank0.epoch{e}.keras" for e in improved)
if saved != want_files:
    fail(f"BestModelCheckpoint saved {saved}, want {want_files} (val_loss {val})")
if r == 0:
    reloaded = hvd.load_model(os.path.join(best_dir, want_files[-1]))
    if len(reloaded.get_weights()) != len(model.get_weights()):
        fail("BestModelCheckpoint: the saved model does not load back")
hvd.allgather_object(r)
if r == 0:
    shutil.rmtree(best_dir)
check(np.float64(hist.history["lr"][-1]), np.float64(0.1), "logged lr", rtol=1e-6)

# ---------------------------------------------------------------- load_model

path = os.path.join(tempfile.mkdtemp(prefix=f"commlib_tf_{r}_"), "model.keras")
model.save(path)
loaded = hvd.load_model(path)
if not hasattr(loaded.optimizer, "register_local_var"):
    fail("load_model did not wrap the optimizer")
if int(loaded.optimizer.iterations.numpy()) != int(model.optimizer.iterations.numpy()):
    fail("load_model lost the optimizer state")
loaded.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
same_on_all_ranks(loaded.get_weights(), "weights after fitting a loaded model")

# mixed_float16: the loss scaling goes inside the DistributedOptimizer (compile
# would otherwise wrap it in a LossScaleOptimizer with a per-rank overflow check)
keras.mixed_precision.set_global_policy("mixed_float16")
model = make_model(seed=5)
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
if not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer) or \
        not hasattr(model.optimizer, "register_local_var"):
    fail(f"mixed_float16: optimizer is {type(model.optimizer).__mro__}")
model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
same_on_all_ranks(model.get_weights(), "mixed_float16 weights")
keras.mixed_precision.set_global_policy("float32")

# Keras functions
check(hvd.allreduce(np.float32(r + 1), op=hvd.Sum), np.float32(n * (n + 1) / 2), "allreduce")
check(hvd.broadcast(tf.constant([r]), 0), np.array([0], np.int32), "broadcast")
check(hvd.allgather(tf.constant([r])), np.arange(n, dtype=np.int32), "allgather")
# ------------------------------------------- local layers and local variables (partial optimizer)
# One SGD step: the shared layer moves by the average of every rank's gradient
# from root's weights; the local layer keeps this rank's own initial weights
# (not broadcast) and moves by this rank's gradient / n (scale_local_gradients).
model = make_model(seed=2000 + r)
local = model.layers[1]
root_start = hvd.broadcast_object(model.get_weights(), root_rank=0)
own_local = local.get_weights()
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=local),
              loss="mse")
rec = Recorder()
x1, y1 = X[:B] + r, Y[:B] * (r + 1)
model.fit(x1, y1, batch_size=B, epochs=1, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(
              0, local_variables=local.trainable_weights), rec])
start = rec.first_weights
for i, want in enumerate(root_start[:2] + own_local):
    check(start[i], want, f"local_variables: weight {i} at the first batch")
ref = make_model(seed=0)
ref.set_weights(start)
with tf.GradientTape() as tape:
    loss = keras.losses.MeanSquaredError()(y1, ref(x1))
grads = [g.numpy() for g in tape.gradient(loss, ref.trainable_weights)]
everyone = hvd.allgather_object(grads[:2])
want = [start[i] - 0.1 * np.mean([g[i] for g in everyone], axis=0) for i in range(2)]
want += [start[i] - 0.1 * grads[i] / n for i in (2, 3)]
for i, (got, w) in enumerate(zip(model.get_weights(), want)):
    check(got, w.astype(np.float32), f"local_layers: weight {i} after one step", rtol=1e-5,
          atol=1e-6)
same_on_all_ranks(model.get_weights()[:2], "local_layers: shared layer")
if len(set(hvd.allgather_object(model.get_weights()[2].tobytes()))) != n:
    fail("local_layers: the local layer's weights should differ across ranks")

done()

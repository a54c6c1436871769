"""ZeRO stages 1 and 2 of the Keras DistributedOptimizer, on every rank.

    keras_zero.py CKPT_DIR   (a float64 run of stage 2 - n ranks ... saves there)

20 Adam steps of a model with an odd number of parameters in several
buckets (bucket_elements=150: uneven shards at 3 ranks, padding), through
model.fit (learning-rate schedule) and custom loops (eager opt.apply and
apply_gradients in a tf.function, the learning rate changed mid-run):
parameters within 1e-5 relative of the unsharded DistributedOptimizer and
1e-4 of one process on the combined batch, bitwise equal across ranks.
Then memory_report, argument errors, the CollectiveMismatchError for a
variable of another shape on one rank, and a checkpoint for
keras_zero_checkpoint.py to load at another size."""
import sys

import keras
import numpy as np
from keras.optimizers.schedules import ExponentialDecay

from keras_zero_common import G, batch, local_rows, make_model, n, r, train, weights
from tf_common import expect_raises, fail, max_rel_err, same_on_all_ranks, done

import commlib.tensorflow.keras as hvd

STEPS, BUCKET, LR_CHANGE = 20, 150, (10, 3e-3)
ckpt_dir = sys.argv[1]


def schedule():
    return ExponentialDecay(0.01, decay_steps=5, decay_rate=0.7)


def dist(stage, lr=0.01):
    return hvd.DistributedOptimizer(keras.optimizers.Adam(lr), zero_stage=stage,
                                    bucket_elements=BUCKET)


def fit(stage):
    model = make_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(schedule()), zero_stage=stage,
                                   bucket_elements=BUCKET)
    model.compile(optimizer=opt, loss="mse")
    xs, ys = zip(*(batch(s) for s in range(STEPS)))
    model.fit(np.concatenate([local_rows(x) for x in xs]),
              np.concatenate([local_rows(y) for y in ys]),
              batch_size=G // n, epochs=1, shuffle=False, verbose=0)
    if int(opt.iterations.numpy()) != STEPS:
        fail(f"fit stage {stage}: iterations {int(opt.iterations.numpy())}")
    return model, opt


def loop(stage, mode, local=True):
    model = make_model()
    opt = dist(stage) if local else keras.optimizers.Adam(0.01)
    train(model, opt, STEPS, local=local, mode=mode, lr_change=LR_CHANGE)
    return model, opt


def compare(what, model, ref, single):
    w = weights(model)
    err, err1 = max_rel_err(w, weights(ref)), max_rel_err(w, weights(single))
    moved = max_rel_err(weights(make_model()), w)
    if err > 1e-5 or err1 > 1e-4 or moved < 1e-3:
        fail(f"{what}: {err} from unsharded, {err1} from one process, moved {moved}")
    same_on_all_ranks(w, what)
    single_errs.append(err1)
    return err


# ---------------------------------------------------------------- equivalence
errs, single_errs = {1: 0.0, 2: 0.0}, []
ref_fit = fit(0)[0]
single_fit = make_model()  # one process, the combined batches, the same schedule
train(single_fit, keras.optimizers.Adam(schedule()), STEPS, local=False)
fit1, fit1_opt = fit(1)
errs[1] = max(errs[1], compare("fit stage 1", fit1, ref_fit, single_fit))
ref_loop, single_loop = loop(0, "eager")[0], loop(0, "eager", local=False)[0]
for stage, mode in ((1, "eager"), (2, "eager"), (2, "function")):
    model, opt = loop(stage, mode)
    errs[stage] = max(errs[stage], compare(f"stage {stage} {mode}", model, ref_loop, single_loop))
print(f"rank {r}: max relative error stage1 {errs[1]:.3g}, stage2 {errs[2]:.3g}", flush=True)
print(f"rank {r}: from one process on the combined batch: {max(single_errs):.3g}", flush=True)

# ---------------------------------------------------------------- memory
psi = sum(int(np.prod(v.shape)) for v in fit1.trainable_variables)
for stage in (0, 1, 2):
    model = make_model(wide=300)
    opt = dist(stage) if stage else hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))
    opt.build(model.trainable_variables)
    rep = hvd.memory_report(model, opt)
    big = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    print(f"rank {r}: memory stage {stage} params {big} {rep}", flush=True)
    limit = 8 * big / (n if stage else 1)
    if not limit * 0.95 <= rep["optimizer_state"] <= 1.05 * limit:
        fail(f"stage {stage}: optimizer state {rep['optimizer_state']} vs 8*{big}/{n}")
    want_grads = 4 * big / (n if stage else 1)  # (both stages reduce-scatter)
    if not want_grads <= rep["gradients"] <= 1.05 * want_grads:
        fail(f"stage {stage}: gradients {rep['gradients']} vs {want_grads}")

# ---------------------------------------------------------------- errors
expect_raises(ValueError, lambda: dist(3), "zero_stage 3", match="zero_stage must be")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(keras.optimizers.Adam(clipnorm=1.0),
                                                           zero_stage=1),
              "clipnorm", match="clipnorm")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(keras.optimizers.Adam(),
                                                           zero_stage=2,
                                                           backward_passes_per_step=2),
              "backward_passes_per_step", match="backward_passes_per_step")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(keras.optimizers.Lamb(), zero_stage=1),
              "Lamb", match="element-wise")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(keras.optimizers.Adam(), zero_stage=1,
                                                           bucket_elements=0),
              "bucket_elements", match="bucket_elements")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(fit1_opt.zero_shard_optimizer, zero_stage=1),
              "built optimizer", match="not been built")
expect_raises(TypeError, lambda: hvd.save_sharded(ckpt_dir, ref_fit, ref_fit.optimizer),
              "save_sharded of a plain optimizer", match="zero_stage")
odd = make_model(wide=33 + (r == n - 1))
opt = dist(2)
e = expect_raises(hvd.CollectiveMismatchError,
                  lambda: train(odd, opt, 1, mode="eager"), "variables of another shape",
                  match="hidden/kernel")
if f"rank {n - 1}:" not in str(e):
    fail(f"mismatch error does not name rank {n - 1}: {e}")

# ---------------------------------------------------------------- checkpoint (float64)
model = make_model(dtype="float64")
opt = dist(2, lr=0.01)
train(model, opt, 6, mode="function", dtype="float64")
hvd.save_sharded(ckpt_dir, model, opt)
done()

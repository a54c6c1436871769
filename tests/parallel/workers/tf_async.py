"""Asynchronous gradient exchange in commlib.tensorflow.keras on every rank:
DistributedOptimizer(staleness=1) in model.fit (compiled and run_eagerly),
DistributedGradientTape(staleness=1) in a custom loop (eager and tf.function;
step 0 applies nothing) and LocalSGD (local SGD, DiLoCo with warm-up, both
also streaming) in model.fit, each checked after every step against a
single-process simulation of its rule computed from all ranks' data (within
1e-5) and bitwise identical across ranks (every step for delayed averaging,
after every meeting for synchronous LocalSGD, after synchronize() for all);
error cases."""
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf
from tf_common import done, expect_raises, fail, max_rel_err, same_on_all_ranks

import commlib.keras as hvd
import commlib.tensorflow as htf

from tf_async_common import (B, DATA, STEPS, average, buffers, grads_of, make_bn_model,
                             make_model, weights)

r, n = hvd.rank(), hvd.size()
worst = {}


class Check(keras.callbacks.Callback):
    """After every step: the weights equal the simulation's (within
    ``tol``) and (where ``same_at`` says) are bitwise equal across ranks."""

    def __init__(self, what, expected, same_at, local_buffers=lambda t: False, tol=1e-5):
        super().__init__()
        self.what, self.expected, self.same_at, self.tol = what, expected, same_at, tol
        self.local_buffers = local_buffers  # (steps after which only the weights agree)

    def on_train_batch_end(self, batch, logs=None):
        err = max_rel_err(weights(self.model), self.expected[batch])
        worst[self.what] = max(worst.get(self.what, 0.0), err)
        if not err <= self.tol:
            fail(f"{self.what}: step {batch}: max relative error {err:.3g} against the simulation")
        if self.same_at(batch):
            same_on_all_ranks(weights(self.model, not self.local_buffers(batch)),
                              f"{self.what} step {batch}")


def fit(model, opt, what, expected, same_at, run_eagerly=False, local_buffers=lambda t: False):
    model.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    x, y = DATA[r]
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0,
              callbacks=[Check(what, expected, same_at, local_buffers)])


# ---------------------------------------------------------------- delayed averaging

def as_fp16(tensors):
    """The float32 values of ``tensors`` rounded to float16."""
    return [tf.cast(tf.cast(t, tf.float16), tf.float32) for t in tensors]


def simulate_delayed(make_opt, fp16=False, passes=1, average_passes=False):
    """Weights after each step and after the final synchronize(); with
    ``fp16``, of fp16 compression: every rank's gradients rounded to float16,
    and their average; with ``passes`` > 1 (backward_passes_per_step), the
    average of the sum (or mean) of each ``passes`` steps' gradients is what
    travels, every ``passes``-th step."""
    assert not (fp16 and passes > 1)
    ref = make_model()
    opt = make_opt()
    opt.build(ref.trainable_variables)  # (iterations counts the accumulating steps)
    out, pending, summed = [], None, None
    for t in range(STEPS):
        if fp16:
            avg = as_fp16(average([as_fp16(grads_of(ref, k, t)) for k in range(n)]))
        else:
            avg = average([grads_of(ref, k, t) for k in range(n)])
        summed = avg if summed is None else [s + a for s, a in zip(summed, avg)]
        if (t + 1) % passes == 0:
            if pending is not None:
                opt.apply(pending, ref.trainable_variables)
            pending = [s / passes for s in summed] if average_passes else summed
            summed = None
        else:  # (the steps that only accumulate count in iterations: Adam's bias correction)
            opt.iterations.assign_add(1)
        out.append(weights(ref))
    opt.apply(pending, ref.trainable_variables)
    return out, weights(ref)


def delayed(make_opt, what, run_eagerly=False, fp16=False, tol=1e-5, passes=1,
            average_passes=False):
    """Keras fit with DistributedOptimizer(staleness=1) (``fp16``: with
    fp16 compression; ``passes``: backward_passes_per_step); returns the
    simulation (reused by tape_delayed for the same optimizer)."""
    expected, final = simulation = simulate_delayed(make_opt, fp16, passes, average_passes)
    model = make_model()
    opt = hvd.DistributedOptimizer(make_opt(), staleness=1, compression=FP16 if fp16 else NONE,
                                   backward_passes_per_step=passes,
                                   average_aggregated_gradients=average_passes)
    start = weights(model)

    class StepZero(keras.callbacks.Callback):
        """Up to the first update nothing is applied; the steps that only
        accumulate count in iterations, the update that applies nothing not."""
        def on_train_batch_end(self, batch, logs=None):
            if batch < passes and (int(opt.iterations) != min(batch + 1, passes - 1)
                                   or max_rel_err(weights(model), start)):
                fail(f"{what}: step {batch} applied something (iterations "
                     f"{int(opt.iterations)})")

    model.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    x, y = DATA[r]
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0,
              callbacks=[StepZero(), Check(what, expected, lambda t: True, tol=tol)])
    if not opt.pending or int(opt.iterations) != STEPS - 1:
        fail(f"{what}: after fit, expected a pending average and {STEPS - 1} iterations")
    opt.synchronize()
    err = max_rel_err(weights(model), final)
    if opt.pending or not err <= tol:
        fail(f"{what}: after synchronize(): pending {opt.pending}, error {err:.3g}")
    same_on_all_ranks(weights(model), f"{what} synchronize")
    return simulation


def SGD_M():
    return keras.optimizers.SGD(0.1, momentum=0.9)


def ADAM():
    return keras.optimizers.Adam(0.01)


FP16, NONE = hvd.Compression.fp16, hvd.Compression.none
# fp16 compression: against a simulation of its rounding (of each rank's
# gradients and of their average; the core's order of summation may round
# differently), and far from the uncompressed rule
FP16_TOL = 1e-4
SIMULATED = {"SGD": delayed(SGD_M, "delayed SGD"),
             "Adam": delayed(ADAM, "delayed Adam eager", run_eagerly=True),
             "SGD fp16": delayed(SGD_M, "delayed SGD fp16", fp16=True, tol=FP16_TOL)}
# backward_passes_per_step: every 2nd step (summed), every 3rd (averaged, eager)
delayed(SGD_M, "delayed SGD 2 passes", passes=2)
delayed(ADAM, "delayed Adam 3 passes averaged, eager", run_eagerly=True, passes=3,
        average_passes=True)


# ---------------------------------------------------------------- DistributedGradientTape

def tape_delayed(make_opt, simulation, what, compiled, compression=None, tol=1e-5):
    """A custom loop with DistributedGradientTape(staleness=1): the same rule
    (``simulation``: of the optimizer's staleness=1), step by step."""
    expected, final = simulation
    compression = compression or NONE
    model, opt, delayed = make_model(), make_opt(), htf.DelayedGradients()
    start = weights(model)
    x, y = DATA[r]

    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        tape = htf.DistributedGradientTape(tape, staleness=1, delayed=delayed,
                                           compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        delayed.apply_gradients(opt, zip(grads, model.trainable_variables))
        return tape.has_average, grads

    step = tf.function(train_step) if compiled else train_step
    for t in range(STEPS):
        have, grads = step(x[t * B:(t + 1) * B], y[t * B:(t + 1) * B])
        if bool(have) != (t > 0) or int(opt.iterations) != t:
            fail(f"{what}: step {t}: has_average {bool(have)}, iterations {int(opt.iterations)}")
        if t == 0 and not compiled and any(g is not None for g in grads):  # None-list eagerly
            fail(f"{what}: step 0 returned gradients eagerly")
        if t == 0 and max_rel_err(weights(model), start):
            fail(f"{what}: step 0 applied something")
        err = max_rel_err(weights(model), expected[t])
        worst[what] = max(worst.get(what, 0.0), err)
        if not err <= tol:
            fail(f"{what}: step {t}: max relative error {err:.3g} against the simulation")
        same_on_all_ranks(weights(model), f"{what} step {t}")
    grads = delayed.synchronize()
    if any(g.dtype != v.dtype for g, v in zip(grads, model.trainable_variables)):
        fail(f"{what}: synchronize() returned {[g.dtype.name for g in grads]}")
    opt.apply_gradients(zip(grads, model.trainable_variables))
    err = max_rel_err(weights(model), final)
    if delayed.pending or delayed.synchronize() is not None or not err <= tol:
        fail(f"{what}: after synchronize(): pending {delayed.pending}, error {err:.3g}")
    same_on_all_ranks(weights(model), f"{what} synchronize")
    return model, delayed


tape_delayed(SGD_M, SIMULATED["SGD"], "tape SGD eager", False)
tape_model, tape_state = tape_delayed(ADAM, SIMULATED["Adam"], "tape Adam tf.function", True)
for compiled in (False, True):
    tape_delayed(SGD_M, SIMULATED["SGD fp16"], f"tape SGD fp16 {'tf.function' if compiled else 'eager'}",
                 compiled, compression=FP16, tol=FP16_TOL)
# (the compressed runs are told apart from the uncompressed rule)
fp16_gap = max_rel_err(SIMULATED["SGD fp16"][1], SIMULATED["SGD"][1])
if r == 0:
    print(f"fp16 compression: worst error against its simulation "
          f"{max(worst[k] for k in worst if 'fp16' in k):.3g}, the simulations differ by "
          f"{fp16_gap:.3g}", flush=True)
if not fp16_gap > 3 * FP16_TOL:
    fail(f"fp16 and float32 simulations differ by {fp16_gap:.3g} only: the test cannot tell them apart")


# ---------------------------------------------------------------- local SGD and DiLoCo

def simulate_local(make_inner, make_outer, period, warmup, streaming=False, make=make_model):
    """One replica per rank; weights (and buffers) of this rank's replica
    after each step, and after synchronize() (the pending streaming meeting,
    then a final meeting if steps were taken since the last)."""
    replicas = [make() for _ in range(n)]
    inner = [make_inner() for _ in range(n)]
    anchor = make()
    outer = make_outer() if make_outer else None

    def averaged(m):  # what a meeting averages: weights, then buffers
        return list(m.trainable_variables) + buffers(m)

    def meeting_step(avg):
        if outer is None:
            return avg
        params = anchor.trainable_variables
        pseudo = [a - v for a, v in zip(params, avg)]
        outer.apply(pseudo, params)
        return [tf.convert_to_tensor(a) for a in params] + list(avg[len(params):])

    def meet():
        new = meeting_step(average([averaged(m) for m in replicas]))
        for m in replicas:
            for v, w in zip(averaged(m), new):
                v.assign(w)

    pending = []  # streaming: [every replica's snapshot] of the last meeting

    def finish_stream():
        if not pending:
            return
        snaps = pending.pop()
        new = meeting_step(average(snaps))
        for m, snap in zip(replicas, snaps):
            for v, w, sv in zip(averaged(m), new, snap):
                v.assign(w + (tf.convert_to_tensor(v) - sv))

    def stream_meet():
        finish_stream()
        pending.append([[tf.identity(v) for v in averaged(m)] for m in replicas])

    out = []
    for t in range(STEPS):
        if t < warmup:
            avg = average([grads_of(m, k, t) for k, m in enumerate(replicas)])
            for m, o in zip(replicas, inner):
                o.apply(avg, m.trainable_variables)
            for a, v in zip(anchor.trainable_variables, replicas[0].trainable_variables):
                a.assign(v)
        else:
            for k, (m, o) in enumerate(zip(replicas, inner)):
                o.apply(grads_of(m, k, t), m.trainable_variables)
            if (t - warmup + 1) % period == 0:
                stream_meet() if streaming else meet()
        out.append(weights(replicas[r]))
    finish_stream()
    if (STEPS - warmup) % period:
        meet()
    return out, weights(replicas[r])


def local_sgd(make_inner, make_outer, period, warmup, what, streaming=False, run_eagerly=False,
              make=make_model):
    expected, final = simulate_local(make_inner, make_outer, period, warmup, streaming, make)
    model = make()
    opt = hvd.LocalSGD(make_inner(), model, period=period,
                       outer_optimizer=make_outer() if make_outer else None, warmup_steps=warmup,
                       streaming=streaming)
    # (streaming: replicas differ by their last round's progress until synchronize())
    fit(model, opt, what, expected,
        lambda t: t < warmup or (not streaming and (t - warmup + 1) % period == 0),
        run_eagerly=run_eagerly, local_buffers=lambda t: t < warmup)
    opt.synchronize()
    err = max_rel_err(weights(model), final)
    if not err <= 1e-5:
        fail(f"{what}: after synchronize(): error {err:.3g}")
    same_on_all_ranks(weights(model), f"{what} synchronize")
    opt.synchronize()  # nothing since the last meeting: no-op (a collective would stall)
    return opt


local_sgd(lambda: keras.optimizers.SGD(0.1, momentum=0.9), None, 4, 0, "local SGD")
local_sgd(lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
          lambda: keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True), 6, 3, "DiLoCo warm-up")
local_sgd(lambda: keras.optimizers.SGD(0.1, momentum=0.9), None, 3, 0, "streaming local SGD",
          streaming=True)
local_sgd(lambda: keras.optimizers.SGD(0.1), lambda: keras.optimizers.SGD(0.7, momentum=0.9,
          nesterov=True), 4, 2, "streaming DiLoCo warm-up, eager", streaming=True, run_eagerly=True)
# BatchNormalization: its moving statistics averaged at every meeting
local_sgd(lambda: keras.optimizers.SGD(0.1, momentum=0.9), None, 4, 0, "local SGD, batch norm",
          make=make_bn_model)
local_sgd(lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
          lambda: keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True), 3, 2,
          "DiLoCo warm-up, batch norm", make=make_bn_model)
local_sgd(lambda: keras.optimizers.SGD(0.1), lambda: keras.optimizers.SGD(0.7, momentum=0.9,
          nesterov=True), 4, 0, "streaming DiLoCo, batch norm", streaming=True,
          make=make_bn_model)



def streaming_restore():
    """KerasState's restore drops a pending streaming meeting (its weights
    were replaced); later meetings make the replicas identical again."""
    model = make_model()
    opt = hvd.LocalSGD(keras.optimizers.SGD(0.1), model, period=2, streaming=True)
    model.compile(optimizer=opt, loss="mse")
    x, y = DATA[r]
    model.fit(x[:2 * B], y[:2 * B], batch_size=B, shuffle=False, verbose=0)
    state = hvd.elastic.KerasState(model, opt)  # (keeps a snapshot, as commit() does)
    committed = weights(model)
    model.fit(x[2 * B:4 * B], y[2 * B:4 * B], batch_size=B, shuffle=False, verbose=0)
    state.restore()
    if opt._commlib_stream.pending or max_rel_err(weights(model), committed) != 0.0:
        fail("streaming LocalSGD: restore() left a meeting pending or other weights")
    model.fit(x[4 * B:8 * B], y[4 * B:8 * B], batch_size=B, shuffle=False, verbose=0)
    opt.synchronize()
    same_on_all_ranks(weights(model), "streaming LocalSGD after restore() and synchronize()")


streaming_restore()


def diloco_state():
    """KerasState checkpoints DiLoCo's outer optimizer (and its counters and
    anchor) besides the inner optimizer; a saved model's optimizer state is
    the inner optimizer's, which load_model's plain optimizer loads whole."""
    def values(variables):
        return [np.array(v.numpy(), copy=True) for v in variables]

    model = make_model()
    outer = keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
    opt = hvd.LocalSGD(keras.optimizers.Adam(0.01), model, period=2, outer_optimizer=outer)
    model.compile(optimizer=opt, loss="mse")
    x, y = DATA[r]
    model.fit(x[:4 * B], y[:4 * B], batch_size=B, shuffle=False, verbose=0)  # two meetings
    state = hvd.elastic.KerasState(model, opt)  # (keeps a snapshot, as commit() does)
    committed = values(model.variables) + values(opt.variables) + values(outer.variables)
    model.fit(x[4 * B:8 * B], y[4 * B:8 * B], batch_size=B, shuffle=False, verbose=0)
    state.restore()
    restored = values(model.variables) + values(opt.variables) + values(outer.variables)
    if any(not np.array_equal(a, b) for a, b in zip(committed, restored)):
        fail("DiLoCo: restore() did not bring back the committed state (outer optimizer?)")
    path = os.path.join(tempfile.mkdtemp(), f"diloco{r}.keras")
    model.save(path)
    loaded = hvd.load_model(path).optimizer
    if int(loaded.iterations.numpy()) != int(opt.iterations.numpy()):
        fail("DiLoCo: load_model lost the inner optimizer's state")


diloco_state()

# ---------------------------------------------------------------- errors

sgd = keras.optimizers.SGD(0.1)
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(sgd, staleness=2), "staleness=2",
              "staleness must be 0")
expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
    sgd, staleness=1, backward_passes_per_step=2, weight_prediction=True),
    "weight prediction with accumulation", "backward_passes_per_step")
tp = tf.GradientTape()
expect_raises(ValueError, lambda: htf.DistributedGradientTape(tp, staleness=1),
              "tape without delayed", "DelayedGradients")
expect_raises(ValueError, lambda: htf.DistributedGradientTape(tp, delayed=htf.DelayedGradients()),
              "delayed without staleness", "staleness=1")
expect_raises(ValueError, lambda: htf.DistributedGradientTape(tp, staleness=2), "tape staleness=2",
              "staleness must be 0")
expect_raises(ValueError, lambda: htf.DistributedGradientTape(
    tp, staleness=1, delayed=tape_state, groups=2), "tape groups", "groups")
expect_raises(ValueError, lambda: htf.DelayedGradients(op=hvd.Max), "DelayedGradients Max",
              "Average or op=Sum")
expect_raises(RuntimeError, lambda: tape_state.apply_gradients(sgd, []), "apply before gradient",
              "after the tape's gradient()")


def only_kernel():
    """A step where the bias has no gradient: the sources changed."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tape_model.trainable_variables[0])
    tape = htf.DistributedGradientTape(tape, staleness=1, delayed=tape_state)
    tape.gradient(loss, tape_model.trainable_variables)


expect_raises(ValueError, only_kernel, "tape sources changed", "changed between steps")
m = make_model()
for bad in (0, -2, 1.5, True):
    expect_raises(ValueError, lambda: hvd.LocalSGD(sgd, m, period=bad), f"period={bad!r}",
                  "period")
expect_raises(ValueError, lambda: hvd.LocalSGD(sgd, m, period=2, warmup_steps=-1),
              "warmup_steps=-1", "warmup_steps")
expect_raises(ValueError, lambda: hvd.LocalSGD(hvd.DistributedOptimizer(sgd), m, period=2),
              "DistributedOptimizer inner", "plain Keras optimizer")
expect_raises(ValueError, lambda: hvd.LocalSGD(sgd, m, period=2, outer_optimizer=sgd),
              "outer is inner", "separate")
expect_raises(ValueError, lambda: hvd.LocalSGD(sgd, "model", period=2), "not a model",
              "keras.Model")
expect_raises(ValueError, lambda: hvd.LocalSGD(sgd, m, period=2, streaming=1), "streaming=1",
              "streaming")
err = expect_raises(hvd.CollectiveMismatchError, lambda: hvd.LocalSGD(sgd, m, period=2 + r),
                    "period differs across ranks")
if "period" not in str(err):
    fail(f"the mismatch error does not name the options: {err}")
bn = make_bn_model()
expect_raises(ValueError, lambda: hvd.LocalSGD(sgd, bn, period=2, average_buffers=1),
              "average_buffers=1", "average_buffers")
err = expect_raises(hvd.CollectiveMismatchError, lambda: hvd.LocalSGD(
    sgd, bn, period=2, average_buffers=r == 0), "average_buffers differs across ranks")
if "average_buffers" not in str(err):
    fail(f"the mismatch error does not name average_buffers: {err}")


def own_statistics():
    """average_buffers=False: a meeting leaves every rank its own moving
    statistics; a frozen layer's variables are never averaged."""
    model = make_bn_model()
    opt = hvd.LocalSGD(keras.optimizers.SGD(0.1), model, period=2, average_buffers=False)
    model.compile(optimizer=opt, loss="mse")
    x, y = DATA[r]
    model.fit(x[:2 * B], y[:2 * B], batch_size=B, epochs=1, shuffle=False, verbose=0)
    same_on_all_ranks(weights(model, with_buffers=False), "average_buffers=False: weights")
    stats = hvd.allgather_object(buffers(model)[0].numpy().tobytes())
    if n > 1 and stats[0] == stats[1]:
        fail("average_buffers=False: the moving statistics were averaged")
    frozen = make_bn_model()
    frozen.layers[1].trainable = False  # the batch norm layer
    if hvd.LocalSGD(keras.optimizers.SGD(0.1), frozen, period=2)._commlib_buffer_vars:
        fail("a frozen layer's moving statistics are averaged")
    if len(hvd.LocalSGD(keras.optimizers.SGD(0.1), make_bn_model(), period=2)
           ._commlib_buffer_vars) != 2:
        fail("the batch norm layer's moving mean and variance are not both averaged")


own_statistics()
if r == 0:
    # (the rules without compression, which the test holds to 1e-5; fp16's
    # are checked against FP16_TOL above)
    exact = [v for k, v in worst.items() if "fp16" not in k]
    print(f"keras async max relative error {max(exact):.3g} "
          f"({', '.join(f'{k} {v:.2g}' for k, v in worst.items())})", flush=True)
done()

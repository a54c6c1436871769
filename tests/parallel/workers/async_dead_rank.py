"""A rank SIGKILLs itself while an asynchronous exchange is in flight (a
delayed average, a streaming local-SGD meeting): the survivors' next step
must raise commlib.RankLostError naming it within 60 s (no hang; Keras'
compiled step: also a tf.errors.AbortedError), and so must synchronize()
(the failed exchange stays pending, it is not taken for a result) and a
later collective; then they exit with code 3.

    async_dead_rank.py MODE VICTIM     MODE: torch-staleness, torch-stream,
                                       keras-staleness, keras-stream
"""
import os
import signal
import sys
import time

mode, victim = sys.argv[1], int(sys.argv[2])
framework, scheme = mode.split("-")

if framework == "keras":
    import tf_common  # noqa: F401 - first: TensorFlow's settings
    import keras
    import numpy as np

    import commlib.keras as hvd
else:
    import torch

    import commlib.torch as hvd
    from torch_async_common import loss_of, mlp, sgd

    torch.set_num_threads(1)
    hvd.init()

import commlib
from _common import fail

me = hvd.rank()

if framework == "torch":
    model = mlp(1)
    if scheme == "staleness":
        opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                       named_parameters=model.named_parameters(), staleness=1)
    else:
        opt = hvd.LocalSGD(sgd(model.parameters()), model, period=2, streaming=True)

    def train(first, steps):
        for t in range(first, first + steps):
            opt.zero_grad()
            loss_of(model, me, t % 20).backward()
            opt.step()
else:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.layers.Input((6,)), keras.layers.Dense(8),
                              keras.layers.Dense(2)])
    if scheme == "staleness":
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), staleness=1)
    else:
        opt = hvd.LocalSGD(keras.optimizers.SGD(0.1), model, period=2, streaming=True)
    model.compile(optimizer=opt, loss="mse")
    rng = np.random.default_rng(me)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = rng.normal(size=(64, 2)).astype(np.float32)

    def train(first, steps):
        for _ in range(0, steps, 8):
            model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)

# Steps in which every rank takes part: an exchange is in flight afterwards.
train(0, 8)
if not getattr(opt, "pending", True):
    fail("no exchange in flight after the first steps")
if me == victim:
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)
start = time.monotonic()


def raises_rank_lost(what, fn, graph=False):
    """``fn()`` raises RankLostError naming the victim; ``graph``: from a
    compiled Keras step, where it is also tf.errors.AbortedError (Horovod's
    class for it, see commlib.tensorflow.errors)."""
    expected = commlib.RankLostError
    try:
        fn()
    except expected as e:
        if f"rank {victim}" not in str(e):
            fail(f"{what}: the error does not name rank {victim}: {e}")
        if graph:
            import tensorflow as tf

            if not isinstance(e, tf.errors.AbortedError):
                fail(f"{what}: {type(e).__name__} is not a tf.errors.AbortedError: {e}")
        return e
    except Exception as e:  # noqa: BLE001 - the check is that it is the expected one
        fail(f"{what}: raised {type(e).__name__} instead of {expected.__name__}: {e}")
    fail(f"{what}: no error")


raises_rank_lost("training", lambda: train(8, 100000), graph=framework == "keras")
elapsed = time.monotonic() - start
print(f"rank {me}: RankLostError in training after {elapsed:.1f}s", flush=True)
if elapsed > 60:
    fail(f"took {elapsed:.1f}s to notice the lost rank")
raises_rank_lost("synchronize()", opt.synchronize)
raises_rank_lost("a later collective", commlib.barrier)
print(f"rank {me}: synchronize() and a later collective also raised", flush=True)
sys.stdout.flush()
os._exit(3)

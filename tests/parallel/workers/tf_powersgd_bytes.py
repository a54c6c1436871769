"""Bytes one Keras training step allreduces, as the core reports them in its
timeline (each allreduce's "bytes"), for the synthetic benchmark's MLP
(12.6M parameters): DistributedOptimizer without compression against
Compression.powersgd(rank=2) once compression has started. Prints both and
their ratio; fails below 20x. (Run by tf_powersgd.py, given a trace path.)"""
import keras
import numpy as np

from powersgd_bytes_common import report, step_bytes
from tf_common import hvd

SIZES = [1024, 2048, 2048, 2048, 1000]


def run(trace, compression, what):
    """Allreduced bytes of this rank in the third step (PowerSGD: the second
    compressed one)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((SIZES[0],))]
                             + [keras.layers.Dense(s, "relu") for s in SIZES[1:-1]]
                             + [keras.layers.Dense(SIZES[-1])])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01),
                                                     compression=compression),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    rng = np.random.default_rng(hvd.rank())
    x, y = rng.standard_normal((4, SIZES[0])).astype("float32"), rng.integers(0, SIZES[-1], 4)
    step = (lambda: model.train_on_batch(x, y))
    return (step_bytes(f"{trace}.{what}", hvd.rank(), [step] * 3, f"keras {what}"),
            model.count_params())


def check(trace):
    sync, params = run(trace, hvd.Compression.none, "sync")
    psgd, _ = run(trace, hvd.Compression.powersgd(rank=2, start_step=1), "powersgd")
    report(hvd.rank(), "keras mlp", params, sync, psgd)

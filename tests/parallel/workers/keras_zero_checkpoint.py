"""Loading a Keras ZeRO checkpoint at another world size, on every rank.

    keras_zero_checkpoint.py CKPT_DIR

CKPT_DIR was written by keras_zero.py at another size: a float64 model
(float64, so that the distributed runs agree with one process on the
combined batch to rounding and the 1e-6 target measures the resharding)
after K Adam steps of zero_stage=2 with bucket_elements=150. Here a model
of another seed and a stage-1 optimizer with another bucket size load it
and take K more steps: the parameters must match an uninterrupted
single-process run of 2K steps within 1e-6, the frozen layer and the
iteration count must be restored, ranks must agree; a missing directory
and a model with a variable the checkpoint lacks raise."""
import sys

import keras
import numpy as np

from keras_zero_common import make_model, r, train, weights
from tf_common import done, expect_raises, fail, max_rel_err, same_on_all_ranks

import commlib.tensorflow.keras as hvd

K, F64 = 6, "float64"
ckpt_dir = sys.argv[1]

ref = make_model(dtype=F64)
train(ref, keras.optimizers.Adam(0.01), 2 * K, local=False, dtype=F64)

model = make_model(seed=1, dtype=F64)
opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), zero_stage=1, bucket_elements=400)
hvd.load_sharded(ckpt_dir, model, opt)
frozen = make_model(dtype=F64).get_layer("frozen").get_weights()
if not all(np.array_equal(a, b) for a, b in zip(model.get_layer("frozen").get_weights(), frozen)):
    fail("the frozen layer's weights were not restored")
if int(opt.iterations.numpy()) != K:
    fail(f"iterations {int(opt.iterations.numpy())} after loading, expected {K}")
train(model, opt, K, start=K, mode="eager", dtype=F64)
err = max_rel_err(weights(model), weights(ref))
print(f"rank {r}: resumed relative error {err:.3g}", flush=True)
if err > 1e-6:
    fail(f"resumed: {err} from the uninterrupted run")
same_on_all_ranks(weights(model), "parameters after loading")

expect_raises(FileNotFoundError, lambda: hvd.load_sharded(ckpt_dir + "-none", model, opt),
              "missing directory", match="save_sharded")
other = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, name="other")])
expect_raises(KeyError, lambda: hvd.load_sharded(ckpt_dir, other, hvd.DistributedOptimizer(
    keras.optimizers.Adam(0.01), zero_stage=1)), "a variable the checkpoint lacks",
    match="other/kernel")
done()

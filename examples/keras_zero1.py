"""Sharded optimizer state (ZeRO stage 1) with commlib.tensorflow.keras:
trains a small Keras MLP classifier with model.fit on synthetic data and
prints the loss and every rank's memory report (bytes held in parameters,
gradients and optimizer state).

    commlibrun -np 2 python examples/keras_zero1.py                  # zero_stage=1
    commlibrun -np 2 python examples/keras_zero1.py --zero-stage 2   # gradients reduce-scattered
    commlibrun -np 2 python examples/keras_zero1.py --zero-stage 0   # no sharding

With zero_stage=1 each rank keeps Adam's moments for 1/size of the weights
(8 bytes per parameter / size instead of 8).
"""
import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import commlib.tensorflow.keras as hvd  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--zero-stage", type=int, choices=[0, 1, 2], default=1)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--samples", type=int, default=2048, help="per rank")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    hvd.init()
    keras.utils.set_random_seed(0)  # the same initial model on every rank
    w = args.width
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(w, activation="relu"),
                              keras.layers.Dense(w, activation="relu"),
                              keras.layers.Dense(w, activation="relu"), keras.layers.Dense(10)])
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3), zero_stage=args.zero_stage)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    centers = np.random.default_rng(1).standard_normal((10, 32)).astype("float32") * 0.3
    data = np.random.default_rng(100 + hvd.rank())  # each rank its own samples
    y = data.integers(0, 10, args.samples)
    x = centers[y] + data.standard_normal((args.samples, 32)).astype("float32")
    history = model.fit(x, y, batch_size=64, epochs=args.epochs, shuffle=False,
                        callbacks=[hvd.callbacks.MetricAverageCallback()], verbose=0)
    if hvd.rank() == 0:
        params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
        print(f"{params} trainable parameters on {hvd.size()} rank(s), zero_stage "
              f"{args.zero_stage}", flush=True)
        for epoch, loss in enumerate(history.history["loss"]):
            print(f"epoch {epoch}: loss {loss:.4f}", flush=True)
    report = hvd.memory_report(model, opt)
    mib = {k: round(v / 2**20, 3) for k, v in report.items()}
    print(f"rank {hvd.rank()}: memory (MiB, zero_stage {args.zero_stage}): {mib} "
          f"optimizer_state bytes {report['optimizer_state']}", flush=True)
    flat = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    same = all(np.array_equal(a, flat) for a in hvd.allgather_object(flat))
    if hvd.rank() == 0:
        print(f"weights identical on all ranks: {same}", flush=True)


if __name__ == "__main__":
    main()

"""Data-parallel Keras training with commlib.tensorflow.keras: model.fit with
DistributedOptimizer and Horovod's callbacks, on a synthetic classification
task (Gaussian clusters, the same data on every rank, each rank fitting its
shard).

    commlibrun -np 2 python examples/keras_train.py
    commlibrun -np 2 python examples/keras_train.py --epochs 8 --fp16-allreduce

Written as for Horovod: with ``horovod.tensorflow.keras`` in the import it is
the Horovod version. Needs Keras 3 with the TensorFlow backend.
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import commlib.tensorflow.keras as hvd  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.01,
                   help="learning rate for one rank (scaled by the number of ranks)")
    p.add_argument("--warmup-epochs", type=int, default=1)
    p.add_argument("--train-samples", type=int, default=16384)
    p.add_argument("--test-samples", type=int, default=4096)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16")
    p.add_argument("--batches-per-allreduce", type=int, default=1,
                   help="backward passes per allreduce (local gradient accumulation)")
    p.add_argument("--threads", type=int, default=1, help="TensorFlow threads per rank")
    return p.parse_args()


def make_data(args):
    """Each class is a mixture of Gaussian clusters interleaved with the other
    classes' (a non-linear boundary); deterministic, the same on every rank."""
    g = np.random.default_rng(args.seed)
    centres = g.normal(size=(args.classes * 8, args.features)) * 0.6

    def sample(count):
        k = g.integers(0, len(centres), count)
        x = centres[k] + g.normal(size=(count, args.features)) * 0.8
        return x.astype(np.float32), (k % args.classes).astype(np.int32)

    return sample(args.train_samples) + sample(args.test_samples)


class Throughput(keras.callbacks.Callback):
    """Samples/s of the whole job per epoch (summed over ranks)."""

    def __init__(self, samples_per_rank):
        super().__init__()
        self.samples = samples_per_rank

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        rate = self.samples / (time.perf_counter() - self.start)
        logs["samples_per_s"] = float(hvd.allreduce(np.float64(rate), op=hvd.Sum))


def main():
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    hvd.init()
    keras.utils.set_random_seed(args.seed + hvd.rank())  # rank 0's weights are broadcast

    x_train, y_train, x_test, y_test = make_data(args)
    shard = slice(hvd.rank(), None, hvd.size())
    x_train, y_train = x_train[shard], y_train[shard]
    steps = len(x_train) // args.batch_size  # the same on every rank
    x_train, y_train = x_train[:steps * args.batch_size], y_train[:steps * args.batch_size]

    model = keras.Sequential([
        keras.layers.Input((args.features,)),
        keras.layers.Dense(args.hidden, activation="relu"),
        keras.layers.Dense(args.hidden, activation="relu"),
        keras.layers.Dense(args.classes),
    ])
    lr = args.lr * hvd.size()  # the global batch is size() times larger
    opt = hvd.DistributedOptimizer(
        keras.optimizers.SGD(lr, momentum=0.9),
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
        backward_passes_per_step=args.batches_per_allreduce,
        average_aggregated_gradients=True)
    model.compile(optimizer=opt, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [
        # Everyone starts from rank 0's weights and optimizer state.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Epoch-end metrics (loss, accuracy, val_*) averaged over ranks.
        hvd.callbacks.MetricAverageCallback(),
        # Ramp the learning rate from lr/size to lr (Goyal et al.).
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=args.warmup_epochs,
                                                 momentum_correction=False),
        Throughput(len(x_train)),
    ]
    if hvd.rank() == 0:
        print(f"{hvd.size()} rank(s), model {model.count_params():,} parameters, batch "
              f"{args.batch_size} per rank, {args.train_samples} training samples", flush=True)

    class Report(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if hvd.rank() == 0:
                print(f"epoch {epoch + 1}: loss {logs['loss']:.4f}  accuracy "
                      f"{logs['accuracy']:.3f}  test accuracy {logs['val_accuracy']:.3f}  "
                      f"{logs['samples_per_s']:,.0f} samples/s", flush=True)

    test = slice(hvd.rank(), None, hvd.size())
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              validation_data=(x_test[test], y_test[test]), callbacks=callbacks + [Report()],
              verbose=0)

    # Every rank ends with the same weights.
    digest = float(sum(np.sum(w.astype(np.float64)) for w in model.get_weights()))
    digests = hvd.allgather_object(digest)
    if hvd.rank() == 0:
        print(f"weights identical on all ranks: {len(set(digests)) == 1}", flush=True)


if __name__ == "__main__":
    main()

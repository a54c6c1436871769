"""A custom TensorFlow 2 training loop with commlib.tensorflow: a tf.function
training step, DistributedGradientTape averaging the gradients, and rank 0's
weights broadcast after the first step (the pattern of Horovod's
tensorflow2_mnist.py), on a synthetic regression task.

    commlibrun -np 2 python examples/tf_gradient_tape.py
    commlibrun -np 2 python examples/tf_gradient_tape.py --steps 400 --fp16-allreduce

Replace ``commlib.tensorflow`` by ``horovod.tensorflow`` in the import for the
Horovod version.
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import commlib.tensorflow as hvd  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.001,
                   help="learning rate for one rank (scaled by the number of ranks)")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16")
    p.add_argument("--threads", type=int, default=1, help="TensorFlow threads per rank")
    return p.parse_args()


def main():
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    hvd.init()

    # A fixed random teacher network makes the targets; every rank draws its
    # own inputs (a different seed per rank = its shard of an endless data set).
    teacher = np.random.default_rng(0).normal(size=(args.features, 1)) / np.sqrt(args.features)
    rng = np.random.default_rng(1 + hvd.rank())

    def batch():
        x = rng.normal(size=(args.batch_size, args.features)).astype(np.float32)
        y = np.sin(2 * x @ teacher).astype(np.float32)
        return tf.constant(x), tf.constant(y)

    keras.utils.set_random_seed(hvd.rank())  # different initial weights: rank 0's win
    model = keras.Sequential([keras.layers.Input((args.features,)),
                              keras.layers.Dense(args.hidden, activation="tanh"),
                              keras.layers.Dense(args.hidden, activation="tanh"),
                              keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(args.lr * hvd.size())
    loss_fn = keras.losses.MeanSquaredError()
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    @tf.function
    def train_step(x, y, first_batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        # The only change for distributed training: wrap the tape.
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        # After the first step (once the optimizer has created its variables),
        # every rank takes rank 0's model and optimizer state.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    if hvd.rank() == 0:
        print(f"{hvd.size()} rank(s), model {model.count_params():,} parameters, batch "
              f"{args.batch_size} per rank", flush=True)
    start, first_loss, loss = time.perf_counter(), None, None
    for step in range(args.steps):
        x, y = batch()
        loss = hvd.allreduce(train_step(x, y, step == 0)).numpy()  # average for logging
        first_loss = loss if first_loss is None else first_loss
        if step == 0:
            start = time.perf_counter()  # exclude tracing from the throughput
        if hvd.rank() == 0 and ((step + 1) % args.log_every == 0 or step == 0):
            print(f"step {step + 1}: loss {loss:.4f}", flush=True)
    elapsed = time.perf_counter() - start
    rate = (args.steps - 1) * args.batch_size * hvd.size() / elapsed
    digests = hvd.allgather_object(float(sum(np.sum(w) for w in model.get_weights())))
    if hvd.rank() == 0:
        print(f"loss {first_loss:.4f} -> {loss:.4f}, {rate:,.0f} samples/s, weights identical "
              f"on all ranks: {len(set(digests)) == 1}", flush=True)


if __name__ == "__main__":
    main()

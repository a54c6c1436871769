"""Synthetic Keras training throughput: commlib.tensorflow.keras versus
tf.distribute.MultiWorkerMirroredStrategy.

Trains a Keras model with model.fit on random data (no input pipeline work)
and prints samples/s, in the style of Horovod's
tensorflow2_synthetic_benchmark.py. The default model is an MLP with about
12.5 million parameters (1024 -> 2048 -> 2048 -> 2048 -> 1000), batch 32
per rank, one TensorFlow thread per rank. With commlib it also prints the
share of the step time spent in the gradient allreduce (wall time inside the
collective, waiting for the other ranks included).

    commlibrun -np 2 python examples/tensorflow_synthetic_benchmark.py
    commlibrun -np 2 python examples/tensorflow_synthetic_benchmark.py --backend mwms
    python examples/tensorflow_synthetic_benchmark.py          # 1 rank baseline

Asynchronous exchange (commlib, model.fit): ``--mode`` sync (default),
staleness1 (DistributedOptimizer(staleness=1)), local-sgd / diloco
(LocalSGD with ``--period`` H; local-sgd-stream / diloco-stream: streaming
meetings), local (no communication: the ceiling), or
several comma-separated: each mode trains a model of its own (from the same
start) and the modes take turns within every iteration (``model.fit`` of
``--num-batches-per-iter`` steps each, the ranks lined up untimed before every
turn), so they are compared in the same run under the same load; each gets
its own summary line:

    commlibrun -np 2 python examples/tensorflow_synthetic_benchmark.py \
        --mode sync,staleness1,local-sgd,local --period 8

With ``--backend mwms`` the workers are started by commlibrun too (commlib
only hands out the ports for TF_CONFIG: localhost workers); TensorFlow's own
collectives (gRPC ring) reduce the gradients.
"""
import argparse
import hashlib
import json
import os
import socket
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=["commlib", "mwms"], default="commlib")
    p.add_argument("--loop", choices=["fit", "custom"], default="fit",
                   help="Keras model.fit, or a tf.function step with a gradient tape "
                        "(always custom with mwms)")
    p.add_argument("--model", choices=["mlp", "small-mlp"], default="mlp",
                   help="mlp: 12.5M parameters; small-mlp: 0.3M (for smoke tests)")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="TensorFlow threads per rank")
    p.add_argument("--fp16-allreduce", action="store_true", help="commlib: fp16 compression")
    p.add_argument("--mode", default="sync",
                   help="commlib, fit loop: comma-separated of sync, staleness1, local-sgd, diloco, "
                        "local-sgd-stream, diloco-stream, local")
    p.add_argument("--period", type=int, default=8, help="local-sgd/diloco: steps per meeting")
    args = p.parse_args()
    args.modes = modes = args.mode.split(",")
    unknown = set(modes) - {"sync", "staleness1", "local-sgd", "diloco", "local-sgd-stream",
                            "diloco-stream", "local"}
    if unknown:
        p.error(f"unknown --mode {sorted(unknown)}")
    if modes != ["sync"] and (args.backend != "commlib" or args.loop != "fit"):
        p.error("--mode other than sync needs --backend commlib and --loop fit")
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    args = parse_args()
    if args.backend == "mwms":
        args.loop = "custom"
    import commlib

    commlib.init()
    rank, size = commlib.rank(), commlib.size()
    if args.backend == "mwms":
        from commlib.objects import broadcast_object

        ports = broadcast_object([free_port() for _ in range(size)] if rank == 0 else None, 0)
        os.environ["TF_CONFIG"] = json.dumps({
            "cluster": {"worker": [f"localhost:{p}" for p in ports]},
            "task": {"type": "worker", "index": rank}})

    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if args.backend == "mwms" else None

    sizes = [1024, 2048, 2048, 2048, 1000] if args.model == "mlp" else [256, 512, 256, 100]

    def build():
        layers = [keras.layers.Input((sizes[0],))]
        layers += [keras.layers.Dense(s, activation="relu") for s in sizes[1:-1]]
        layers += [keras.layers.Dense(sizes[-1])]
        return keras.Sequential(layers)

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    modes = args.modes
    if strategy is None:
        import commlib.tensorflow.keras as hvd

        def make_optimizer(mode, model):
            sgd = keras.optimizers.SGD(0.01)
            if mode == "local":
                return sgd
            if mode.startswith(("local-sgd", "diloco")):
                outer = (keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
                         if mode.startswith("diloco") else None)
                return hvd.LocalSGD(sgd, model, period=args.period, outer_optimizer=outer,
                                    streaming=mode.endswith("-stream"))
            return hvd.DistributedOptimizer(
                sgd, staleness=1 if mode == "staleness1" else 0,
                compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none)

        model = build()
        opt = make_optimizer(modes[0], model)
        model.compile(optimizer=opt, loss=loss)
        batch = args.batch_size
    else:
        with strategy.scope():
            model = build()
            model.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss)
        batch = args.batch_size * size  # MWMS splits the global batch over the workers

    g = np.random.default_rng(rank)
    x = g.normal(size=(args.batch_size * 4, sizes[0])).astype(np.float32)
    y = g.integers(0, sizes[-1], size=args.batch_size * 4).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)
    if strategy is not None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.OFF
        data = data.with_options(options)

    times, comm = [], []  # (the custom loop's)
    if rank == 0:
        print(f"Model: {args.model} ({model.count_params():,} parameters), batch size "
              f"{args.batch_size} per rank, {size} rank(s), backend {args.backend}, "
              f"{args.loop} loop", flush=True)

    if args.loop == "fit":
        class Timer(keras.callbacks.Callback):
            """Times the steps after the first of a fit call (the first one
            also pays for fit's own set-up, the same for every mode)."""

            def __init__(self, times, comm, cpu):
                super().__init__()
                self.times, self.comm, self.cpu = times, comm, cpu

            def on_train_batch_end(self, batch, logs=None):
                if batch == 0:
                    hvd.communication_stats(reset=True)
                    self.start, self.cpu_start = time.perf_counter(), time.process_time()

            def on_epoch_end(self, epoch, logs=None):
                self.times.append(time.perf_counter() - self.start)
                self.cpu.append(time.process_time() - self.cpu_start)
                self.comm.append(hvd.communication_stats()["seconds"])

        runs = {}
        for i, mode in enumerate(modes):
            if i > 0:  # (each mode trains a model of its own, from the same start)
                model = build()
                opt = make_optimizer(mode, model)
                model.compile(optimizer=opt, loss=loss)
            runs[mode] = (model, opt, [], [], [])
            start_alike = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]  # (one per model)
            model.fit(data, steps_per_epoch=args.num_warmup_batches, epochs=1, verbose=0,
                      shuffle=False, callbacks=start_alike)  # warm-up: tracing, first allocations
        for _ in range(args.num_iters):
            for mode, (model, opt, times, comm, cpu) in runs.items():
                # Untimed: a pending average of the turn before is done and the
                # ranks start together (the drift a turn leaves is not the next one's).
                commlib.barrier()
                model.fit(data, steps_per_epoch=args.num_batches_per_iter + 1, epochs=1,
                          verbose=0, shuffle=False, callbacks=[Timer(times, comm, cpu)])
        for mode, (model, opt, times, comm, cpu) in runs.items():
            if hasattr(opt, "synchronize"):  # (the pending average, a last meeting)
                opt.synchronize()
            prefix = f"[{mode}] " if len(modes) > 1 else ""
            report(args, rank, size, times, comm, prefix, cpu)
            if mode != "local":  # (replicas must agree after the last average)
                from commlib.objects import allgather_object

                digest = hashlib.sha256(b"".join(np.asarray(v).tobytes() for v in model.weights))
                same = len(set(allgather_object(digest.hexdigest()))) == 1
                if rank == 0:
                    print(f"{prefix}weights identical on all ranks: {same}", flush=True)
        return
    else:
        # A custom loop (Horovod's tensorflow2_synthetic_benchmark.py); Keras 3's
        # model.fit does not run under MultiWorkerMirroredStrategy (keras#20585).
        import commlib.tensorflow as hvd_tf

        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                step_loss = loss(yb, model(xb, training=True))
                if strategy is not None:  # the optimizer sums over replicas
                    step_loss = step_loss / strategy.num_replicas_in_sync
            if strategy is None:
                tape = hvd_tf.DistributedGradientTape(tape, compression=opt_compression)
            grads = tape.gradient(step_loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return step_loss

        if strategy is None:
            opt = keras.optimizers.SGD(0.01)
            opt_compression = (hvd.Compression.fp16 if args.fp16_allreduce
                               else hvd.Compression.none)
            step = tf.function(replica_step)
            it = iter(data)
            hvd_tf.broadcast_variables(model.variables, root_rank=0)

            def run(k):
                for _ in range(k):
                    out = step(*next(it))
                return out.numpy()
        else:
            with strategy.scope():
                opt = keras.optimizers.SGD(0.01)
            it = iter(strategy.experimental_distribute_dataset(data))

            @tf.function
            def step(batch_):
                return strategy.run(replica_step, args=batch_)

            def run(k):
                for _ in range(k):
                    out = step(next(it))
                return strategy.experimental_local_results(out)[0].numpy()

        run(args.num_warmup_batches)
        for _ in range(args.num_iters):
            if strategy is None:
                hvd_tf.communication_stats(reset=True)
            start = time.perf_counter()
            run(args.num_batches_per_iter)
            times.append(time.perf_counter() - start)
            if strategy is None:
                comm.append(hvd_tf.communication_stats()["seconds"])

    report(args, rank, size, times, comm if strategy is None else None)


def report(args, rank, size, times, comm, prefix="", cpu=None):
    """Prints samples/s per rank (mean over the ranks' own means) and, with
    commlib, each rank's share of the step time spent in its collectives and
    (``cpu``: seconds of CPU per timed iteration) the CPU per step (every
    thread of the rank's process: TensorFlow's, commlib's background thread,
    MPI's)."""
    import commlib

    rates = np.array([args.batch_size * args.num_batches_per_iter / t for t in times])
    step_ms = 1000 * np.mean(times) / args.num_batches_per_iter
    mean = float(commlib.allreduce(np.array([rates.mean()]), op=commlib.Average, name="bench.rate")[0])
    if comm is not None:
        share = float(np.sum(comm) / np.sum(times))
        shares = commlib.allgather(np.array([share], np.float64), name="bench.share")
    if cpu is not None:
        cpu_ms = 1000 * float(np.sum(cpu)) / (len(cpu) * args.num_batches_per_iter)
        cpu_ms = float(commlib.allreduce(np.array([cpu_ms]), op=commlib.Average, name="bench.cpu")[0])
    if rank == 0:
        print(f"{prefix}Img/sec per rank: {mean:.1f} +-{1.96 * rates.std():.1f}, "
              f"step {step_ms:.1f} ms", flush=True)
        print(f"{prefix}Total samples/s on {size} rank(s): {size * mean:.1f} "
              f"+-{size * 1.96 * rates.std():.1f}", flush=True)
        if comm is not None:
            print(f"{prefix}Communication share of the step time (per rank): "
                  + ", ".join(f"{s:.1%}" for s in shares), flush=True)
        if cpu is not None:
            print(f"{prefix}CPU per step: {cpu_ms:.1f} ms per rank, wall {step_ms:.1f} ms",
                  flush=True)


if __name__ == "__main__":
    main()

"""A two-stage GPipe pipeline in TensorFlow on commlib.tensorflow.send/recv.

    commlibrun -np 2 python examples/pipeline_tf_gpipe.py

Rank 0 holds the first Dense layer, rank 1 the second and the loss. Each
step splits the batch into M microbatches: rank 0 sends every microbatch's
activation forward, rank 1 computes each loss and sends the activation's
gradient back (tag gradient_tag(i)); rank 0's tape receives it through the
send's token. Both accumulate gradients (scaled by 1/M) and apply them; at
the end every rank compares its layer with one process trained on the whole
batches and prints the largest relative difference. (The schedule library,
commlib.torch.pipelining, is PyTorch-only.)
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import commlib.tensorflow as hvd  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
hvd.init()
assert hvd.size() == 2, "run with 2 ranks"
r, M, STEPS, LR = hvd.rank(), 4, 10, 0.1


def layers():
    g = np.random.default_rng(0)
    return [tf.Variable(g.normal(0, 0.5, (6, 16)).astype(np.float32)),
            tf.Variable(g.normal(0, 0.5, (16, 2)).astype(np.float32))]


def batch(step):
    g = np.random.default_rng(100 + step)
    return g.normal(size=(16, 6)).astype(np.float32), g.normal(size=(16, 2)).astype(np.float32)


@tf.function
def first_stage(w, xs):
    grads = tf.zeros_like(w)
    for i in range(M):  # GPipe: every forward, then every backward
        with tf.GradientTape() as tape:
            token = hvd.send(tf.tanh(xs[i] @ w), dst=1, tag=i)
        grads += tape.gradient(token, w)  # receives the activation's gradient from rank 1
    return grads


@tf.function
def last_stage(w, ys):
    grads, losses = tf.zeros_like(w), []
    for i in range(M):
        h = hvd.recv(src=0, tag=i, dtype=tf.float32, shape=[None, 16])
        with tf.GradientTape() as tape:
            tape.watch(h)
            loss = tf.reduce_mean((h @ w - ys[i]) ** 2) / M
        gw, gh = tape.gradient(loss, [w, h])
        hvd.send(gh, dst=0, tag=hvd.gradient_tag(i))
        grads += gw
        losses.append(loss * M)
    return grads, tf.reduce_mean(losses)


mine, ref = layers()[r], layers()
for step in range(STEPS):
    x, y = batch(step)
    if r == 0:
        mine.assign_sub(LR * first_stage(mine, tf.split(x, M)))
    else:
        g, loss = last_stage(mine, tf.split(y, M))
        mine.assign_sub(LR * g)
        print(f"step {step}: loss {float(loss):.4f}", flush=True)
    with tf.GradientTape() as tape:  # the single-process reference
        loss = tf.reduce_mean((tf.tanh(x @ ref[0]) @ ref[1] - y) ** 2)
    for v, gv in zip(ref, tape.gradient(loss, ref)):
        v.assign_sub(LR * gv)
err = float(tf.reduce_max(tf.abs(mine - ref[r])) / tf.reduce_max(tf.abs(ref[r])))
print(f"rank {r}: max relative difference from one process {err:.2e}", flush=True)

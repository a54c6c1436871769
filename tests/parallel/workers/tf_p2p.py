"""commlib.tensorflow.send/recv on every rank, eagerly and inside
tf.function: dtypes and shapes (changing between calls of one traced
function), a chain of ranks trained with GradientTape whose gradients match
one process, and the error paths."""
import numpy as np
import tensorflow as tf
from tf_common import check, done, expect_raises, fail, hvd

r, n = hvd.rank(), hvd.size()
prev, nxt = (r - 1) % n, (r + 1) % n


def payload(src, i, dtype, shape):
    g = np.random.default_rng(100 * src + i)
    return (g.normal(size=shape) * 10).astype(dtype)


def ring(x, tag, dtype=None, shape=None, fn_send=hvd.send, fn_recv=hvd.recv):
    """Rank 0 sends first, every other rank receives first: a ring of
    blocking sends without a deadlock."""
    if r == 0:
        fn_send(x, nxt, tag)
        return fn_recv(prev, tag, dtype, shape)
    y = fn_recv(prev, tag, dtype, shape)
    fn_send(x, nxt, tag)
    return y


# ---- eager: the receiver learns dtype and shape
for i, (dtype, shape) in enumerate([(np.float32, (3, 4)), (np.float64, ()), (np.int64, (0, 2)),
                                    (np.int32, (30000,)), (np.float16, (2, 2, 2))]):
    y = ring(tf.constant(payload(r, i, dtype, shape)), i)
    check(y, payload(prev, i, dtype, shape), f"eager {np.dtype(dtype).name}{shape}")


# ---- tf.function: dtype given, shape learned at run time, one trace for every shape
@tf.function
def exchange(x):
    return ring(x, 20, tf.float32)


for k, shape in enumerate([(2, 3), (5, 3), (1, 3)]):
    y = exchange(tf.constant(payload(r, 30 + k, np.float32, shape)))
    check(y, payload(prev, 30 + k, np.float32, shape), f"tf.function shape {shape}")
# the input signature is unknown in dimension 0, so one trace served every shape
exchange_sig = tf.function(lambda x: ring(x, 21, tf.float32, [None, 3]),
                           input_signature=[tf.TensorSpec([None, 3], tf.float32)])
for k in (2, 6):
    y = exchange_sig(tf.constant(payload(r, 40 + k, np.float32, (k, 3))))
    if y.shape != (k, 3):
        fail(f"shape {y.shape}")
if exchange_sig.experimental_get_tracing_count() != 1:
    fail("the signature function retraced")


# ---- GradientTape along a chain 0 -> 1 -> ... -> n-1, eagerly and in tf.function
def weights(k):
    return tf.Variable(payload(k, 200, np.float64, (4, 4)) / 10)


X = tf.constant(payload(0, 300, np.float64, (5, 4)))


def reference():
    ws = [weights(k) for k in range(n)]
    with tf.GradientTape() as tape:
        h = X
        for w in ws:
            h = tf.tanh(h @ w)
        loss = tf.reduce_sum(h ** 2)
    return [g.numpy() for g in tape.gradient(loss, ws)]


def chain_step(w):
    """This rank's part of one forward/backward; returns its weight's gradient."""
    h = X if r == 0 else hvd.recv(r - 1, 7, tf.float64, [5, 4])
    with tf.GradientTape() as tape:
        tape.watch(h)
        out = tf.tanh(h @ w)
        target = hvd.send(out, r + 1, 7) if r < n - 1 else tf.reduce_sum(out ** 2)
    gw, gh = tape.gradient(target, [w, h])
    if r > 0:
        hvd.send(gh, r - 1, hvd.gradient_tag(7))
    return gw


ref = reference()
w = weights(r)
check(chain_step(w), ref[r], "eager chain gradient", rtol=1e-12, atol=1e-12)
check(tf.function(chain_step)(w), ref[r], "tf.function chain gradient", rtol=1e-12,
      atol=1e-12)

# ---- errors
expect_raises(TypeError, lambda: tf.function(lambda: hvd.recv(prev, 1))(), "recv without dtype",
              "needs dtype")
expect_raises(ValueError, lambda: hvd.send(tf.ones(2), n, 1), "dst outside the job", "outside")
expect_raises(ValueError, lambda: hvd.send(tf.ones(2), nxt, 2**63), "tag range", "2**63")
expect_raises(TypeError, lambda: hvd.send(tf.constant(["a"]), nxt, 1), "string dtype",
              "unsupported dtype")
# a message of another dtype than the traced one fails the receiver (the sender completes)
if r == 0:
    hvd.send(tf.ones(3, tf.float64), nxt, 90)
elif r == 1:
    try:
        tf.function(lambda: hvd.recv(0, 90, tf.float32))()
        fail("recv of a float64 message as float32 must raise")
    except (tf.errors.OpError, TypeError) as e:
        if "expected float32" not in str(e):
            fail(f"dtype mismatch message: {e}")
hvd.barrier()
done()

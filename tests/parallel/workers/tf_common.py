"""Setup shared by the tf_*.py workers: quiet, single-threaded TensorFlow
(2-core CI machines run several ranks), commlib.tensorflow initialised, and
helpers to compare tensors with numpy on every rank."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # same kernels for every batch size

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
tf.get_logger().setLevel("ERROR")

import commlib.tensorflow as hvd  # noqa: E402
from _common import check_equal, done, expect_raises, fail  # noqa: E402,F401

hvd.init()


def np_of(t) -> np.ndarray:
    return t.numpy() if hasattr(t, "numpy") else np.asarray(t)


def check(got, want, what, rtol=0.0, atol=0.0):
    check_equal(np_of(got), np.asarray(want), what, rtol=rtol, atol=atol)


def same_on_all_ranks(arrays, what):
    """Every rank's arrays are bitwise equal to rank 0's."""
    arrays = [np.asarray(a) for a in arrays]
    mine = b"".join(a.tobytes() for a in arrays)
    everyone = hvd.allgather_object(mine)
    if any(x != everyone[0] for x in everyone):
        fail(f"{what}: differs across ranks")


def max_rel_err(got, want) -> float:
    """Largest elementwise difference of each array relative to the array's
    largest magnitude (floored at 1% of the largest over all arrays, so that
    arrays that stay near zero, such as a bias followed by batch norm, do
    not turn rounding noise into a large relative error)."""
    got = [np.asarray(g, np.float64) for g in got]
    want = [np.asarray(w, np.float64) for w in want]
    floor = 0.01 * max(float(np.max(np.abs(w))) if w.size else 0.0 for w in want) + 1e-30
    worst = 0.0
    for g, w in zip(got, want):
        if w.size:
            worst = max(worst, float(np.max(np.abs(g - w)) / max(np.max(np.abs(w)), floor)))
    return worst

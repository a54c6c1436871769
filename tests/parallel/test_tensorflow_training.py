"""Training with commlib.tensorflow: DistributedGradientTape (2 and 3 ranks,
workers/tf_tape.py) and Keras model.fit with DistributedOptimizer and the
callbacks (2 ranks, workers/tf_keras.py). N ranks x batch B must end within
1e-5 relative of one process trained on the N*B batches (float32, 20 steps
for the tape), with weights bitwise equal across ranks."""
import re

import pytest

pytest.importorskip("tensorflow")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [3])  # (2 ranks: the Keras test below, test_tensorflow_async, the examples)
def test_distributed_gradient_tape(ranks, n):
    run = ranks(n, "tf_tape.py", timeout=170)
    run.assert_ok(n)
    m = re.search(r"tape equivalence max relative error (\S+)", run.stdout)
    assert m and float(m.group(1)) <= 1e-5, run


@pytest.mark.timeout(200)
def test_keras_distributed_optimizer_and_callbacks(ranks):
    run = ranks(2, "tf_keras.py", timeout=170)
    run.assert_ok(2)
    m = re.search(r"keras equivalence max relative error (\S+)", run.stdout)
    assert m and float(m.group(1)) <= 1e-5, run

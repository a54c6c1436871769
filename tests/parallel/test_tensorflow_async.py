"""Asynchronous gradient exchange in commlib.tensorflow.keras on 2 and 3
ranks (workers/tf_async.py): DistributedOptimizer(staleness=1) and LocalSGD
(local SGD, DiLoCo with warm-up) in model.fit, and DistributedGradientTape(
staleness=1) with DelayedGradients in a custom loop (eager and tf.function),
match a single-process simulation of their rule within 1e-5 after every one
of 20 steps, with bitwise identical replicas; error cases."""
import re

import pytest

pytest.importorskip("tensorflow")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_keras_delayed_averaging_and_local_sgd(ranks, n):
    run = ranks(n, "tf_async.py", timeout=170)
    run.assert_ok(n)
    m = re.search(r"keras async max relative error (\S+)", run.stdout)
    assert m and float(m.group(1)) <= 1e-5, run


@pytest.mark.timeout(120)
def test_result_buffers_are_reused_only_when_released(ranks):
    ranks(2, "tf_result_buffers.py", timeout=90).assert_ok(2)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_keras_weight_prediction_matches_its_simulation(ranks, n):
    run = ranks(n, "tf_weight_prediction.py", timeout=120)
    run.assert_ok(n)
    m = re.search(r"keras weight prediction max relative error (\S+)", run.stdout)
    assert m and float(m.group(1)) <= 1e-5, run

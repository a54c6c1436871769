"""Asynchronous gradient exchange in commlib.tensorflow.keras on 2 ranks
(workers/tf_async.py): DistributedOptimizer(staleness=1) and LocalSGD
(local SGD, DiLoCo with warm-up) in model.fit, and DistributedGradientTape(
staleness=1) with DelayedGradients in a custom loop (eager and tf.function),
and DistributedOptimizer(staleness=1, weight_prediction=True)
(workers/tf_weight_prediction.py, run by tf_async.py) match a
single-process simulation of their rule within 1e-5 after every one of 20
steps, with bitwise identical replicas; error cases."""
import re

import pytest

pytest.importorskip("tensorflow")


@pytest.mark.timeout(400)
# (2 ranks only, in one job: TensorFlow's start dominates these runs; the
# 2- and 3-rank cases of the same rules run in test_torch_async.py)
def test_keras_asynchronous_exchange_matches_its_simulation(ranks):
    run = ranks(2, "tf_async.py", timeout=360)  # (~60 s on a quiet 2-core machine; far more under load)
    run.assert_ok(2)
    for reports in ("keras async", "keras weight prediction"):
        m = re.search(reports + r" max relative error (\S+)", run.stdout)
        assert m and float(m.group(1)) <= 1e-5, run


@pytest.mark.timeout(120)
def test_result_buffers_are_reused_only_when_released(ranks):
    ranks(2, "tf_result_buffers.py", timeout=90).assert_ok(2)

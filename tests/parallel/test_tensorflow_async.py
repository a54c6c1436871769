"""Asynchronous gradient exchange in commlib.tensorflow.keras on 2 ranks
(workers/tf_async.py): DistributedOptimizer(staleness=1) and LocalSGD
(local SGD, DiLoCo with warm-up) in model.fit, and DistributedGradientTape(
staleness=1) with DelayedGradients in a custom loop (eager and tf.function),
and DistributedOptimizer(staleness=1, weight_prediction=True)
(workers/tf_weight_prediction.py) match a single-process simulation of their
rule within 1e-5 after every one of 20 steps, with bitwise identical
replicas; error cases. Both workers run in one job (workers/in_one_job.py:
TensorFlow starts once on each rank); if the first fails, so does the
second's case."""
import re

import pytest
from one_job import scripts_in_one_job

pytest.importorskip("tensorflow")

one_job = scripts_in_one_job("tf_async.py", "tf_weight_prediction.py", timeout=360)


@pytest.mark.timeout(400)
# (one rank count: TensorFlow's start dominates these runs; the 2- and 3-rank
# cases of the same rules run in test_torch_async.py)
@pytest.mark.parametrize("worker, reports", [
    ("tf_async.py", "keras async"),  # delayed averaging, the tape, LocalSGD
    ("tf_weight_prediction.py", "keras weight prediction"),
])
def test_keras_asynchronous_exchange_matches_its_simulation(one_job, worker, reports):
    run = one_job(2)  # (~60 s for both on a quiet 2-core machine; far more under load)
    run.assert_script_ok(worker, 2)
    m = re.search(reports + r" max relative error (\S+)", run.stdout)
    assert m and float(m.group(1)) <= 1e-5, run


@pytest.mark.timeout(120)
def test_result_buffers_are_reused_only_when_released(ranks):
    ranks(2, "tf_result_buffers.py", timeout=90).assert_ok(2)

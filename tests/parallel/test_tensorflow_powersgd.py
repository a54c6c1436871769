"""Compression.powersgd in the Keras DistributedOptimizer and in
DistributedGradientTape on 3 ranks (see workers/tf_powersgd.py): 20 steps
match an independent float64 simulation of the rule within 1e-9 with
bitwise-identical replicas after every step (optimizer in a traced step and
with backward_passes_per_step=2, tape in a tf.function and eagerly with a
cold start, the optimizer over the process sets {0, 2} and {1, 2}),
checkpoints restore exactly, and unsupported combinations are refused;
PowerSGD rank 2 allreduces at least 20x fewer bytes per step of the
synthetic benchmark's MLP than sync (counted by the core's timeline). One
job: TensorFlow's start dominates it; the rule's 2-rank case (it lives in
commlib/powersgd.py, framework-free) runs in test_torch_powersgd.py."""
import re

import pytest

pytest.importorskip("tensorflow")


@pytest.mark.timeout(300)
def test_powersgd_matches_simulation_and_restarts_exactly(ranks, tmp_path):
    n = 3
    run = ranks(n, "tf_powersgd.py", str(tmp_path / "trace"), timeout=270)
    run.assert_ok(n)
    diffs = [float(d) for d in re.findall(r"max relative difference from the simulation (\S+)",
                                          run.stdout)]
    assert len(diffs) == 4 * n and max(diffs) <= 1e-9, run.stdout
    sets = [float(d) for d in re.findall(r"process set \[\d, \d\]: max relative difference "
                                         r"from its simulation (\S+)", run.stdout)]
    assert len(sets) == 2 * n and max(sets) <= 1e-9, run.stdout
    counts = re.findall(r"keras mlp: parameters \d+, bytes per step: sync (\d+), powersgd rank 2 (\d+)",
                        run.stdout)
    assert len(counts) == n and all(int(sync) >= 20 * int(psgd) for sync, psgd in counts), run.stdout

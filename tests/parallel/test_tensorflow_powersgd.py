"""Compression.powersgd in the Keras DistributedOptimizer and in
DistributedGradientTape on 2 and 3 ranks (see workers/tf_powersgd.py): 20
steps match an independent float64 simulation of the rule within 1e-9 with
bitwise-identical replicas after every step (optimizer in a traced step and
with backward_passes_per_step=2, tape in a tf.function and eagerly with a
cold start; at 3 ranks the optimizer over the process sets {0, 2} and {1, 2}),
checkpoints restore exactly, and unsupported combinations are
refused; at 2 ranks, PowerSGD rank 2 allreduces at least 20x fewer bytes per
step of the synthetic benchmark's MLP than sync (counted by the core's
timeline)."""
import re

import pytest

pytest.importorskip("tensorflow")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 3])
def test_powersgd_matches_simulation_and_restarts_exactly(ranks, n, tmp_path):
    # at 2 ranks the worker also counts a step's bytes (one job: TensorFlow starts once)
    run = ranks(n, "tf_powersgd.py", *([str(tmp_path / "trace")] if n == 2 else []),
                timeout=270)
    run.assert_ok(n)
    diffs = [float(d) for d in re.findall(r"max relative difference from the simulation (\S+)",
                                          run.stdout)]
    assert len(diffs) == 4 * n and max(diffs) <= 1e-9, run.stdout
    sets = [float(d) for d in re.findall(r"process set \[\d, \d\]: max relative difference "
                                         r"from its simulation (\S+)", run.stdout)]
    assert len(sets) == (2 * n if n == 3 else 0) and max(sets, default=0) <= 1e-9, run.stdout
    if n == 2:
        m = re.search(r"keras mlp: parameters \d+, bytes per step: sync (\d+), powersgd rank 2 "
                      r"(\d+)", run.stdout)
        assert m and int(m.group(1)) >= 20 * int(m.group(2)), run.stdout

"""The ZeRO examples on 2 ranks: examples/pytorch_zero.py trains to the same
losses with fully_shard (stage 3), with zero_stage=2 and without sharding,
and prints a memory report per rank whose optimizer state shrinks with
sharding; the synthetic benchmark runs with --zero-stage 1, 2 and 3."""
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _losses_and_state(run):
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", run.stdout)]
    state = [float(x) for x in re.findall(r"'optimizer_state': ([\d.]+)", run.stdout)]
    return losses, state


@pytest.mark.timeout(200)
def test_pytorch_zero_example_stages_agree(ranks):
    runs = {}
    for stage in (0, 2, 3):
        run = ranks(2, str(EXAMPLES / "pytorch_zero.py"), "--zero-stage", str(stage),
                    "--steps", "41", timeout=60)
        assert run.returncode == 0, run
        runs[stage] = _losses_and_state(run)
    base_losses, base_state = runs[0]
    assert len(base_losses) == 3 and base_losses[-1] < 0.8 * base_losses[0], runs
    for stage in (2, 3):
        losses, state = runs[stage]
        assert losses == pytest.approx(base_losses, rel=1e-3, abs=1e-4), (stage, runs)
        assert len(state) == 2 and max(state) <= 0.55 * base_state[0], (stage, runs)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_synthetic_benchmark_zero_runs(ranks, stage):
    run = ranks(2, str(EXAMPLES / "pytorch_synthetic_benchmark.py"), "--model", "small-mlp",
                "--zero-stage", str(stage), "--optimizer", "adam", "--num-warmup-batches", "1",
                "--num-iters", "2", "--num-batches-per-iter", "2", timeout=60)
    assert run.returncode == 0, run
    assert "Total samples/s on 2 rank(s)" in run.stdout, run
    assert len(re.findall(rf"memory \(MiB, zero{stage}\)", run.stdout)) == 2, run

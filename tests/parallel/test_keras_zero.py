"""ZeRO stages 1 and 2 of the Keras DistributedOptimizer (workers/keras_zero.py,
workers/keras_zero_checkpoint.py): at 3 ranks (stage 1 at 2: the example), 20 Adam steps through
model.fit and custom loops (eager and tf.function) within 1e-5 relative of
the unsharded DistributedOptimizer and 1e-4 of one process, equal across
ranks; memory_report (optimizer state 8*params/size); argument errors and a
variable of another shape on one rank; a sharded checkpoint saved at 3
ranks loaded at 2 continues to the uninterrupted run's parameters within
1e-6 (the torch checkpoints go both ways: test_torch_zero_checkpoint.py)."""
import re
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")


@pytest.mark.timeout(330)
@pytest.mark.parametrize("n,load_n", [(3, 2)])  # (TensorFlow's start dominates; 2-rank training: test_keras_zero1_example)
def test_keras_zero_and_checkpoint_across_sizes(ranks, tmp_path, n, load_n):
    ckpt = str(tmp_path / "ckpt")
    run = ranks(n, "keras_zero.py", ckpt, timeout=180)
    run.assert_ok(n)
    errs = re.findall(r"max relative error stage1 (\S+), stage2 (\S+)", run.stdout)
    assert len(errs) == n and max(float(e) for pair in errs for e in pair) <= 1e-5, run
    assert len(re.findall(r"memory stage \d", run.stdout)) == 3 * n, run
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == ["extra", "meta.json"] + [f"shard-{i:05d}" for i in range(n)], files
    run = ranks(load_n, "keras_zero_checkpoint.py", ckpt, timeout=120)
    run.assert_ok(load_n)
    resumed = [float(e) for e in re.findall(r"resumed relative error (\S+)", run.stdout)]
    assert len(resumed) == load_n and max(resumed) <= 1e-6, run


@pytest.mark.timeout(150)
def test_keras_zero1_example(ranks):
    examples = Path(__file__).resolve().parents[2] / "examples"
    run = ranks(2, str(examples / "keras_zero1.py"), "--epochs", "3", timeout=120)
    assert run.returncode == 0, run
    params = int(re.search(r"(\d+) trainable parameters on 2 rank\(s\), zero_stage 1",
                           run.stdout).group(1))
    losses = [float(x) for x in re.findall(r"epoch \d: loss (\d+\.\d+)", run.stdout)]
    assert len(losses) == 3 and losses[-1] < 0.8 * losses[0], run
    state = [int(x) for x in re.findall(r"optimizer_state bytes (\d+)", run.stdout)]
    assert len(state) == 2 and all(s <= 1.05 * 8 * params / 2 for s in state), run
    assert "weights identical on all ranks: True" in run.stdout, run

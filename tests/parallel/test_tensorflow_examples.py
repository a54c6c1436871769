"""The TensorFlow examples run on 2 ranks: the loss falls, accuracy rises,
samples/s is reported and every rank ends with the same weights."""
import re
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.timeout(150)
def test_keras_train(ranks):
    run = ranks(2, str(EXAMPLES / "keras_train.py"), "--epochs", "3", "--train-samples", "8192",
                timeout=120)
    assert run.returncode == 0, run
    acc = [float(a) for a in re.findall(r"test accuracy (\d\.\d+)", run.stdout)]
    assert len(acc) == 3 and acc[-1] > acc[0] and acc[-1] > 0.6, run
    assert "samples/s" in run.stdout and "weights identical on all ranks: True" in run.stdout, run


@pytest.mark.timeout(150)
def test_tf_gradient_tape(ranks):
    run = ranks(2, str(EXAMPLES / "tf_gradient_tape.py"), "--steps", "120", timeout=120)
    assert run.returncode == 0, run
    m = re.search(r"loss (\S+) -> (\S+), ([\d,]+) samples/s, weights identical on all ranks: "
                  r"True", run.stdout)
    assert m and float(m.group(2)) < 0.5 * float(m.group(1)), run


@pytest.mark.timeout(240)
def test_synthetic_benchmark_modes(ranks):
    """Every --mode of the Keras synthetic benchmark trains and reports, and
    the replicas agree after the last average (sync, staleness 1 after
    synchronize(), local SGD and DiLoCo after their last meeting)."""
    modes = ["sync", "staleness1", "local-sgd", "diloco", "local-sgd-stream", "local"]
    run = ranks(2, str(EXAMPLES / "tensorflow_synthetic_benchmark.py"), "--model", "small-mlp",
                "--mode", ",".join(modes), "--period", "3", "--num-warmup-batches", "2",
                "--num-iters", "2", "--num-batches-per-iter", "4", timeout=200)
    assert run.returncode == 0, run
    for mode in modes:
        assert re.search(rf"\[{mode}\] Total samples/s on 2 rank\(s\): \d", run.stdout), run
    for mode in modes[:-1]:
        assert f"[{mode}] weights identical on all ranks: True" in run.stdout, run
    assert "[local] weights identical" not in run.stdout, run

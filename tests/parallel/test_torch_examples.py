"""The PyTorch examples run under the launcher: training converges (accuracy
rises) on 2 ranks and on 1, and the synthetic benchmark runs with both
backends (commlib, and torch DDP over gloo started by commlibrun); powersgd_links.py
measures its modes and counts their bytes."""
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

# Absolute paths: run_ranks otherwise looks in tests/parallel/workers/.
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [1, 2])
def test_pytorch_train_accuracy_rises(ranks, n):
    run = ranks(n, str(EXAMPLES / "pytorch_train.py"), "--epochs", "3", "--train-samples",
                "8192", timeout=120)
    assert run.returncode == 0, run
    acc = [float(a) for a in re.findall(r"test accuracy (\d\.\d+)", run.stdout)]
    assert len(acc) == 3, run
    assert acc[-1] > acc[0] + 0.05 and acc[-1] > 0.6, run
    assert "samples/s" in run.stdout


@pytest.mark.timeout(150)
@pytest.mark.parametrize("backend", ["commlib", "ddp"])
def test_synthetic_benchmark_runs(ranks, backend):
    run = ranks(2, str(EXAMPLES / "pytorch_synthetic_benchmark.py"), "--backend", backend,
                "--model", "small-mlp", "--num-warmup-batches", "1", "--num-iters", "2",
                "--num-batches-per-iter", "2", timeout=120)  # (rank 0 picks MASTER_PORT)
    assert run.returncode == 0, run
    assert re.search(r"Total samples/s on 2 rank\(s\): \d", run.stdout), run


@pytest.mark.timeout(150)
def test_synthetic_benchmark_powersgd(ranks):
    run = ranks(2, str(EXAMPLES / "pytorch_synthetic_benchmark.py"), "--device", "cpu",
                "--model", "small-mlp", "--compression", "powersgd:2", "--num-warmup-batches",
                "1", "--num-iters", "2", "--num-batches-per-iter", "2", timeout=120)
    if run.returncode != 0:
        pytest.fail(run.describe(), pytrace=False)
    assert "compression: powersgd:2" in run.stdout, run
    assert re.search(r"Total samples/s on 2 rank\(s\): \d", run.stdout), run


@pytest.mark.timeout(150)
def test_synthetic_benchmark_sync_bn(ranks):
    run = ranks(2, str(EXAMPLES / "pytorch_synthetic_benchmark.py"), "--device", "cpu",
                "--model", "resnet18", "--sync-bn", "--batch-size", "2", "--num-warmup-batches",
                "1", "--num-iters", "1", "--num-batches-per-iter", "1", timeout=120)
    if run.returncode != 0:
        pytest.fail(run.describe(), pytrace=False)
    assert "sync-bn: on" in run.stdout, run
    assert re.search(r"Total samples/s on 2 rank\(s\): \d", run.stdout), run


@pytest.mark.parametrize("args,message", [
    (["--compare"], "--sync-bn with DDP needs --device cuda"),
    (["--model", "small-mlp"], "--sync-bn: --model small-mlp has no BatchNorm layer")])
def test_synthetic_benchmark_sync_bn_refusals(args, message):
    import os
    import subprocess
    import sys

    # (the checkout on the path, as the ranks fixture's jobs have it: a refusal
    # after `import commlib.torch` must not depend on an installed commlib)
    path = os.pathsep.join(filter(None, [str(EXAMPLES.parent), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(EXAMPLES / "pytorch_synthetic_benchmark.py"),
                           "--device", "cpu", "--sync-bn", *args],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=path))
    assert proc.returncode != 0 and message in proc.stderr, proc


@pytest.mark.timeout(150)
def test_powersgd_links_measures_and_counts_bytes(ranks, tmp_path):
    import json

    out = tmp_path / "links.json"
    run = ranks(2, str(EXAMPLES / "powersgd_links.py"), "--model", "small-mlp", "--modes",
                "sync,powersgd2,diloco", "--period", "2", "--turns", "2", "--batch-size", "4",
                "--out", str(out), timeout=120)
    if run.returncode != 0:
        pytest.fail(run.describe(), pytrace=False)
    modes = json.loads(out.read_text())["modes"]
    sent = {m: v["bytes_per_step"] for m, v in modes.items()}
    # (the small MLP has 288 612 parameters)
    assert sent["sync"] >= 4 * 288_612 and sent["sync"] >= 20 * sent["powersgd2"], sent
    assert sent["diloco"] == pytest.approx(sent["sync"] / 2, rel=0.05), sent  # a meeting per 2
    assert all(len(v["loss"]) == len(v["seconds"]) == 4 for v in modes.values()), modes


@pytest.mark.parametrize("value", ["powersgd", "powersgd:0", "fp32"])
def test_synthetic_benchmark_refuses_bad_compression(value):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(EXAMPLES / "pytorch_synthetic_benchmark.py"),
                           "--device", "cpu", "--compression", value],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "none, fp16, bf16 or powersgd:R (R >= 1)" in proc.stderr, proc


@pytest.mark.timeout(150)
@pytest.mark.parametrize("model,amp", [("transformer", "bf16"), ("small-mlp", "fp16")])
def test_synthetic_benchmark_compare(ranks, model, amp):
    """--compare trains with commlib and DDP in one job, taking turns, and
    prints each one's first step, the ratios and the time to broadcast the
    model (broadcast_parameters against a loop of torch.distributed.broadcast); --amp trains under autocast
    (fp16 through a GradScaler and commlib's synchronize/skip_synchronize)."""
    run = ranks(2, str(EXAMPLES / "pytorch_synthetic_benchmark.py"), "--compare", "--device",
                "cpu", "--model", model, "--width", "32", "--layers", "2", "--seq-len", "8",
                "--amp", amp, "--num-warmup-batches", "1", "--num-iters", "2",
                "--num-batches-per-iter", "2", timeout=120)  # (rank 0 picks MASTER_PORT)
    if run.returncode != 0:
        pytest.fail(run.describe(), pytrace=False)
    for backend in ("commlib", "ddp"):
        assert re.search(rf"First step \[{backend}\]: \d+\.\d+ s", run.stdout), run
        assert re.search(rf"\[{backend}\] Total samples/s on 2 rank\(s\): \d", run.stdout), run
    assert re.search(r"Ratio commlib/ddp: samples/s \d+\.\d+x, first step \d+\.\d+x", run.stdout), run
    assert re.search(r"Broadcast of the model's \d+ tensors \(\d+\.\d MB\) from rank 0: commlib "
                     r"broadcast_parameters \d+\.\d ms, a loop of torch.distributed.broadcast "
                     r"\d+\.\d ms \(\d+\.\d+x\)", run.stdout), run
    assert f"amp: {amp}" in run.stdout, run


def test_synthetic_benchmark_refuses_missing_cuda():
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "pytorch_synthetic_benchmark.py"),
                           "--device", "cuda"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "CUDA is not available" in proc.stderr, proc

"""The pipeline examples run at 2 ranks, the 3D-parallel one at 4 ranks
(2 pipeline stages x 2 data-parallel replicas; 2-way tensor x 2-way data),
and end where one process ends (each rank prints its largest relative
difference, checked here)."""
import re
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def assert_matches_one_process(run, n):
    assert run.returncode == 0, run
    errs = re.findall(r"rank \d: max relative difference from one process (\S+)", run.stdout)
    assert len(errs) == n and all(float(e) <= 1e-5 for e in errs), run


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,script,args", [
    (2, "pipeline_torch.py", ("--schedule", "GPipe", "--steps", "5")),
    (2, "pipeline_torch.py", ("--schedule", "Interleaved1F1B", "--steps", "5")),
    (4, "parallel_3d.py", ("--layout", "pp2dp2", "--steps", "6")),
    (4, "parallel_3d.py", ("--layout", "tp2dp2", "--steps", "6")),
])
def test_torch_examples_match_one_process(ranks, n, script, args):
    pytest.importorskip("torch")
    assert_matches_one_process(ranks(n, str(EXAMPLES / script), *args, timeout=120), n)


@pytest.mark.timeout(150)
def test_tensorflow_gpipe_example(ranks):
    pytest.importorskip("tensorflow")
    assert_matches_one_process(ranks(2, str(EXAMPLES / "pipeline_tf_gpipe.py"), timeout=120), 2)


@pytest.mark.timeout(60)
def test_parallel_3d_example_rejects_a_layout_of_another_size(ranks):
    pytest.importorskip("torch")
    run = ranks(2, str(EXAMPLES / "parallel_3d.py"), "--layout", "pp2dp2", timeout=45)
    assert run.returncode != 0 and "needs 4 ranks, the job has 2" in run.stdout + run.stderr, run

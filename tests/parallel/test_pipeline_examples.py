"""The pipeline examples run at 2 ranks and end where one process ends
(each rank prints its largest relative difference, checked here)."""
import re
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def assert_matches_one_process(run, n):
    assert run.returncode == 0, run
    errs = re.findall(r"rank \d: max relative difference from one process (\S+)", run.stdout)
    assert len(errs) == n and all(float(e) <= 1e-5 for e in errs), run


@pytest.mark.timeout(150)
@pytest.mark.parametrize("schedule", ["GPipe", "Interleaved1F1B"])
def test_torch_pipeline_example(ranks, schedule):
    pytest.importorskip("torch")
    run = ranks(2, str(EXAMPLES / "pipeline_torch.py"), "--schedule", schedule, "--steps", "5",
                timeout=120)
    assert_matches_one_process(run, 2)


@pytest.mark.timeout(150)
def test_tensorflow_gpipe_example(ranks):
    pytest.importorskip("tensorflow")
    assert_matches_one_process(ranks(2, str(EXAMPLES / "pipeline_tf_gpipe.py"), timeout=120), 2)

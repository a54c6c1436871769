"""Asynchronous gradient exchange in commlib.torch on 3 ranks (the frontend's rules
are the same at any size, and 3 ranks split unevenly; the core's
collectives under it run at 2, 3 and 4 ranks in test_collectives.py)
(see workers/torch_delayed.py and workers/torch_local_sgd.py): delayed averaging
(staleness=1) and local SGD / DiLoCo (also streaming: one round stale) match
a single-process simulation of their rule within 1e-5 after 20 steps, with
bitwise identical replicas (every step for delayed averaging, after every
meeting for local SGD, after synchronize() when streaming); error cases.

The workers run in one job (workers/in_one_job.py: torch starts once on
each rank); a worker that fails ends it, failing the tests of the workers
after it as well."""
import re

import pytest
from one_job import scripts_in_one_job

pytest.importorskip("torch")

one_job = scripts_in_one_job("torch_delayed.py", "torch_local_sgd.py", "torch_weight_prediction.py", timeout=250)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [3])
def test_torch_delayed_averaging(one_job, n):
    run = one_job(n)
    run.assert_script_ok("torch_delayed.py", n)
    m = re.search(r"delayed max relative error SGD (\S+), Adam (\S+), Sum (\S+)", run.stdout)
    assert m and all(float(m.group(i)) <= 1e-5 for i in (1, 2, 3)), run


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [3])
def test_torch_local_sgd_and_diloco(one_job, n):
    run = one_job(n)
    run.assert_script_ok("torch_local_sgd.py", n)
    m = re.search(r"local sgd max relative error local (\S+), DiLoCo (\S+), warm-up (\S+), "
                  r"streaming local (\S+), streaming DiLoCo (\S+), BatchNorm (\S+) (\S+) (\S+)",
                  run.stdout)
    assert m and all(float(m.group(i)) <= 1e-5 for i in range(1, 9)), run


@pytest.mark.timeout(150)
def test_async_curves_example_runs(ranks):
    """The loss-curve example trains every mode, PowerSGD's too (no PNG: matplotlib is not a
    test dependency) and every mode's held-out loss falls below the initial."""
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "pytorch_async_curves.py"
    modes = ("sync", "staleness1", "staleness1-predict", "local-sgd", "diloco", "powersgd2")
    run = ranks(2, str(example), "--steps", "48", "--eval-every", "16", "--modes", ",".join(modes),
                timeout=120)
    assert run.returncode == 0, run
    start = float(re.search(r"initial (\S+),", run.stdout).group(1))
    for mode in modes:
        m = re.search(rf"final {mode}: (\S+) ", run.stdout)
        assert m and float(m.group(1)) < 0.5 * start, run


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [3])
def test_torch_delayed_weight_prediction(one_job, n):
    run = one_job(n)
    run.assert_script_ok("torch_weight_prediction.py", n)
    m = re.search(r"weight prediction max relative error SGD (\S+), Adam (\S+)", run.stdout)
    assert m and all(float(m.group(i)) <= 1e-5 for i in (1, 2)), run

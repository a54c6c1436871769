"""Asynchronous gradient exchange in commlib.torch on 2 and 3 ranks (see
workers/torch_delayed.py and workers/torch_local_sgd.py): delayed averaging
(staleness=1) and local SGD / DiLoCo match a single-process simulation of
their rule within 1e-5 after 20 steps, with bitwise identical replicas (every
step for delayed averaging, after every meeting for local SGD); error cases."""
import re

import pytest

pytest.importorskip("torch")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_torch_delayed_averaging(ranks, n):
    run = ranks(n, "torch_delayed.py", timeout=120)
    run.assert_ok(n)
    m = re.search(r"delayed max relative error SGD (\S+), Adam (\S+), Sum (\S+)", run.stdout)
    assert m and all(float(m.group(i)) <= 1e-5 for i in (1, 2, 3)), run


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_torch_local_sgd_and_diloco(ranks, n):
    run = ranks(n, "torch_local_sgd.py", timeout=120)
    run.assert_ok(n)
    m = re.search(r"local sgd max relative error local (\S+), DiLoCo (\S+), warm-up (\S+)",
                  run.stdout)
    assert m and all(float(m.group(i)) <= 1e-5 for i in (1, 2, 3)), run

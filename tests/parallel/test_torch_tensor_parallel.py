"""commlib.torch.tensor_parallel and ParallelGrid (see
workers/torch_tensor_parallel.py): tensor-parallel layers against the dense
model (forward, every gradient slice, both the parallel and the gathered
paths) at 2 ranks; 10 SGD steps of tp=2 x dp=2 and of 2 pipeline stages x
dp=2 at 4 ranks against one process; uneven splits and bad grids raise."""
import re

import pytest

pytest.importorskip("torch")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,mode", [(2, "tp"), (4, "tp-dp"), (4, "pp-dp")])
def test_parallel_layers_and_grids_match_one_process(ranks, n, mode):
    run = ranks(n, "torch_tensor_parallel.py", mode, timeout=120)
    run.assert_ok(n)
    m = re.search(rf"{mode} ParallelGrid.*: max relative parameter error after 10 SGD steps (\S+)",
                  run.stdout)
    assert m and float(m.group(1)) <= 1e-5, run

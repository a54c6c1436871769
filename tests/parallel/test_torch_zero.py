"""ZeRO stages 1 and 2 of commlib.torch.DistributedOptimizer on 3 ranks (the frontend's rules
are the same at any size, and 3 ranks split unevenly; the core's
collectives under it run at 2, 3 and 4 ranks in test_collectives.py)
(see workers/torch_zero.py): 20 Adam steps with param groups, an LR
scheduler, several buckets and uneven shards within 1e-5 relative of the
unsharded DistributedOptimizer and 1e-4 of one process (bitwise equal across
ranks); accumulation, clipping, a parameter unused on one rank, state dict
round trips, process sets, memory_report (optimizer state 8*params/size),
argument errors and parameter mismatches across ranks.

The workers run in one job (workers/in_one_job.py: torch starts once on
each rank); a worker that fails ends it, failing the tests of the workers
after it as well."""
import re

import pytest
from one_job import scripts_in_one_job

pytest.importorskip("torch")

one_job = scripts_in_one_job("torch_zero.py", "torch_zero1_grads.py", "torch_zero_state.py",
                             timeout=200)
n = 3


@pytest.mark.timeout(250)
def test_torch_zero_optimizer(one_job):
    run = one_job(n)
    run.assert_script_ok("torch_zero.py", n)
    m = re.search(r"max relative error stage1 (\S+), stage2 (\S+)", run.stdout)
    assert m and float(m.group(1)) <= 1e-5 and float(m.group(2)) <= 1e-5, run
    assert len(re.findall(r"memory stage 2", run.stdout)) == n, run


@pytest.mark.timeout(250)
def test_torch_zero1_step_alone_and_synchronize(one_job):
    """Stage 1 with step() alone (p.grad keeps this rank's gradient) and with
    synchronize() first (p.grad holds the averaged gradient on every rank,
    clipped or not), taking turns with both kinds of zero_grad: parameters
    within 1e-5 of unsharded after every step, identical across ranks."""
    run = one_job(n)
    run.assert_script_ok("torch_zero1_grads.py", n)
    assert len(re.findall(r"stage 1 paths checked over 12 steps", run.stdout)) == n, run


@pytest.mark.timeout(250)
def test_torch_zero_state_shows_owned_parameters(one_job):
    """workers/torch_zero_state.py: opt.state[p] of a ZeRO optimizer holds the
    state of the parameters (or slices) this rank owns, equal to one
    process's Adam; state_dict() keeps its shard form."""
    run = one_job(n)
    run.assert_script_ok("torch_zero_state.py", n)
    errs = [float(e) for e in re.findall(r"zero state max relative error (\S+)", run.stdout)]
    assert len(errs) == n and max(errs) <= 1e-9, run

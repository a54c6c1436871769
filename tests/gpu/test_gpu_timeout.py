"""COMMLIB_TIMEOUT on the GPU path: a rank that stops calling ends the
others with CollectiveTimeoutError naming it within COMMLIB_TIMEOUT + 10 s,
and a rank frozen inside an NCCL collective (SIGSTOP) fails the others by the
GPU-side timeout, which aborts their communicator; then the job goes on (a
new communicator) and ends normally, with no process left behind. See tests/parallel/workers/gpu_cuda_timeout.py."""
import time

import pytest

T = 10


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("case,sync", [("sleeps", "stream"), ("frozen", "stream"), ("frozen", "host")])
def test_stopped_rank_ends_the_others(ranks, gpu_env, n, case, sync):
    env = dict(gpu_env, COMMLIB_TIMEOUT=str(T), COMMLIB_CUDA_SYNC=sync)
    start = time.monotonic()
    run = ranks(n, "gpu_cuda_timeout.py", case, timeout=240, env=env)
    run.assert_ok(n)
    assert time.monotonic() - start < 240, run

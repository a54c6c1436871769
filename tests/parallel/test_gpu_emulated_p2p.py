"""Point-to-point between device buffers through the core's NCCL links, on
CPU against the GPU emulator (tests/gpu_emulator/build.py): a ring of every
dtype in both directions at once (into device memory of the right size and
into the core's), sends synchronized before their receives, tags
synchronized out of order, one tag's order, host messages into receives that
take device messages, the refusals on both ends, a send that waits for its data on the caller's stream,
and a stopped peer that ends a transfer by COMMLIB_TIMEOUT after which the
two ranks go on. At 2 and 3 ranks. See tests/parallel/workers/gpu_emulated_p2p.py.
Real GPUs: tests/gpu/test_gpu_p2p.py."""

import pytest
from concurrent_jobs import in_background, started_together


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 3])
def test_device_messages_through_nccl_links(ranks, gpu_emulator, n):
    ranks(n, "gpu_emulated_p2p.py", "exchange", timeout=240, env=gpu_emulator).assert_ok(n)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_device_send_waits_for_the_callers_stream(ranks, gpu_emulator, n):
    env = dict(gpu_emulator, COMMLIB_GPU_EMULATOR_DELAY_US="30000")
    ranks(n, "gpu_emulated_p2p.py", "ordering", timeout=150, env=env).assert_ok(n)


def start_stopped_peer(request, tmp, n):
    env = dict(request.getfixturevalue("gpu_emulator"), COMMLIB_TIMEOUT="4")
    return in_background(request.getfixturevalue("ranks"), n, "gpu_emulated_p2p.py", "frozen",
                         timeout=150, env=env)


# (both rank counts at once: each job waits out the timeout, using little CPU)
stopped_peer_job = started_together("test_stopped_peer_ends_a_device_transfer_by_the_timeout",
                                    start_stopped_peer, "stopped_peer_job")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_stopped_peer_ends_a_device_transfer_by_the_timeout(stopped_peer_job, n):
    run = stopped_peer_job[0]
    run.assert_ok(n)
    assert run.seconds < 60, run.seconds


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_torch_point_to_point_through_nccl_links(ranks, gpu_emulator, n):
    """commlib.torch's NCCL steps (frontends/torch/cuda_p2p.py) on CPU tensors
    standing for CUDA ones: send/recv, isend/irecv, out=, device=, sendrecv,
    the autograd pairs, the errors, and host messages into its receives."""
    pytest.importorskip("torch")
    ranks(n, "torch_p2p_cuda_paths.py", "nccl", timeout=150, env=gpu_emulator).assert_ok(n)

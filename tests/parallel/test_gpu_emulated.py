"""The core's NCCL executor on CPU, against the GPU emulator
(tests/gpu_emulator/build.py): every collective x dtype x op equals numpy and
the CPU path, bitwise identical across ranks; fusion, process sets, the
refusals; a collective waits for its input's ready event on the caller's
stream and completes only once its result is in place; synchronize on the
caller's stream returns before the device ran the collective, and that
stream sees the result; a stopped rank ends
the others by the timeout (the GPU-side one, with ncclCommAbort, when it is
frozen inside the collective; after a synchronize on the stream, from the
next synchronize) and the job goes on; a communicator whose creation never
completes fails the first collective by the timeout; a joined rank stands in
for the others' CUDA collectives; negotiation messages far above MPI's eager
size while launches block the engine outside MPI complete. At 2 and 3 ranks. See
tests/parallel/workers/gpu_emulated.py. Real GPUs: tests/gpu/."""

import pytest
from concurrent_jobs import in_background, started_together

T = 4


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 3])
def test_collectives_on_the_nccl_executor(ranks, gpu_emulator, n):
    ranks(n, "gpu_emulated.py", "collectives", timeout=240, env=gpu_emulator).assert_ok(n)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_collective_waits_for_its_input_and_completes_with_its_result(ranks, gpu_emulator, n):
    env = dict(gpu_emulator, COMMLIB_GPU_EMULATOR_DELAY_US="30000")
    ranks(n, "gpu_emulated.py", "ordering", timeout=150, env=env).assert_ok(n)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_synchronize_on_stream_leaves_the_wait_to_the_stream(ranks, gpu_emulator, n):
    env = dict(gpu_emulator, COMMLIB_GPU_EMULATOR_DELAY_US="30000")
    ranks(n, "gpu_emulated.py", "stream", timeout=150, env=env).assert_ok(n)


def start_stopped(request, tmp, n, how):
    """The worker's case ``how`` with COMMLIB_TIMEOUT=T."""
    env = dict(request.getfixturevalue("gpu_emulator"), COMMLIB_TIMEOUT=str(T))
    return in_background(request.getfixturevalue("ranks"), n, "gpu_emulated.py", how, timeout=150,
                         env=env)


# (the cases' jobs at once: each waits out the timeout, using little CPU)
stopped_job = started_together("test_stopped_rank_ends_the_others_by_the_timeout", start_stopped,
                               "stopped_job")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("how", ["sleeps", "frozen", "frozen-on-stream"])
def test_stopped_rank_ends_the_others_by_the_timeout(stopped_job, n, how):
    """It passes, the whole job within 60 s."""
    run = stopped_job[0]
    run.assert_ok(n)
    assert run.seconds < 60, run.seconds


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_joined_rank_stands_in_for_cuda_collectives(ranks, gpu_emulator, n):
    ranks(n, "gpu_emulated.py", "join", timeout=150, env=gpu_emulator).assert_ok(n)


def start_init_hang(request, tmp, n):
    env = dict(request.getfixturevalue("gpu_emulator"), COMMLIB_TIMEOUT=str(T),
               COMMLIB_STALL_CHECK_TIME="1", COMMLIB_GPU_EMULATOR_INIT_HANG_RANK=str(n - 1))
    return in_background(request.getfixturevalue("ranks"), n, "gpu_emulated.py", "init-hang",
                         timeout=150, env=env)


init_hang_job = started_together("test_communicator_creation_that_hangs_ends_by_the_timeout",
                                 start_init_hang, "init_hang_job")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_communicator_creation_that_hangs_ends_by_the_timeout(init_hang_job, n):
    # (and says so once COMMLIB_STALL_CHECK_TIME has passed, on every rank)
    run = init_hang_job[0]
    run.assert_ok(n)
    assert run.seconds < 60, run.seconds
    warned = [line for line in run.stderr.splitlines() if "WARNING: ncclCommInitRank (rank" in line]
    assert {line[:4] for line in warned} == {f"[{q}]:" for q in range(n)}, run.stderr


# MPI made to move a message above 1 KiB only while its sender calls into MPI
# (as Open MPI's shared-memory transport does above its 4 KiB eager limit
# where single copy is unavailable, e.g. in containers): MPICH's (the suite's)
# knobs, and Open MPI's for a build against it.
SENDER_DRIVEN_MPI = {
    "MPIR_CVAR_CH4_CMA_ENABLE": "0",
    "MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_CELL_SIZE": "1024",
    "MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_NUM_CELLS": "4",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_responses_above_the_eager_size(ranks, gpu_emulator, n):
    """ResNet-50's broadcast_parameters and first gradient allreduce (320 long
    names), each launch blocking the engine outside MPI: they complete."""
    env = dict(gpu_emulator, **SENDER_DRIVEN_MPI, COMMLIB_GPU_EMULATOR_CONNECT="1", COMMLIB_TIMEOUT="30")
    ranks(n, "gpu_emulated_big_messages.py", "320", timeout=120, env=env).assert_ok(n)

"""Collectives beyond one MPI call (MPI's counts are int): allgather, alltoall
and reducescatter, alone and fused, with more bytes than COMMLIB_TEST_MPI_CALL_BYTES
(lowered to 256 bytes so that small arrays need many pieces) on every route:
MPI on one host, MPI across (simulated) hosts, shared memory. And one real
allgather of more than 2 GiB per rank where the machine has the memory."""
import pytest

from test_collectives import assert_all_ok

# the worker checks that requests in flight together were fused: hold them
# (asynchronous ones only; a blocking call is never held) long enough that a
# loaded machine's Python between two submissions does not split the batch
PIECES = {"COMMLIB_TEST_MPI_CALL_BYTES": "256", "COMMLIB_BATCH_GAP_US": "100000", "COMMLIB_CYCLE_TIME": "200"}
MPI_PATHS = {**PIECES, "COMMLIB_SHM_COLLECTIVES": "never"}
TWO_HOSTS = {**PIECES, "COMMLIB_TEST_RANKS_PER_HOST": "1"}
SHM_PATHS = {**PIECES, "COMMLIB_SHM_COLLECTIVES": "always"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,env,route", [
    pytest.param(2, MPI_PATHS, "mpi", id="np2-mpi"),
    pytest.param(3, MPI_PATHS, "mpi", id="np3-mpi"),
    pytest.param(3, TWO_HOSTS, "mpi", id="np3-hosts"),
    pytest.param(2, SHM_PATHS, "shm", id="np2-shm"),
    pytest.param(3, SHM_PATHS, "shm", id="np3-shm"),
])
def test_collectives_beyond_one_mpi_call(ranks, tmp_path, n, env, route):
    run = ranks(n, "coll_pieces.py", str(tmp_path / "timeline.json"), route, timeout=120, env=env)
    assert_all_ok(run, n)


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# Each of the 2 ranks holds the whole result (its own part gathered in place)
# and numpy's checks need little more.
BIG_NEEDS = 2 * (2 * (2 ** 31 + 4099)) + (2 << 30)


@pytest.mark.timeout(200)
def test_allgather_beyond_2gib_per_rank(ranks):
    if available_bytes() < BIG_NEEDS:
        pytest.skip(f"needs {BIG_NEEDS / 2**30:.1f} GiB of available memory, "
                    f"has {available_bytes() / 2**30:.1f} GiB")
    run = ranks(2, "coll_allgather_big.py", timeout=150)
    assert_all_ok(run, 2)

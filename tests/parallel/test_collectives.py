"""Collectives against numpy on 2, 3 and 4 ranks.

Each test runs one worker script (tests/parallel/workers/coll_*.py) that
batches many checks: every rank computes the expected result of each check
from every rank's deterministic input, checks its own result, and at the end
the ranks prove (through mpi4py) that they hold bitwise identical results.
A failing check is printed as ``rank R: FAILED: ...`` on stderr and the
worker goes on with the other checks, then exits non-zero; a disagreement that
would leave ranks waiting for each other ends the job at once.
"""
import pytest
from concurrent_jobs import in_background, started_together

# Knobs of the core that select other code paths.
MPI_ALGO = {"COMMLIB_ALLREDUCE_ALGO": "mpi"}       # MPI_Allreduce instead of shared memory
SMALL_SHM_PIECES = {"COMMLIB_SHM_PIECE_BYTES": "4096"}  # many pipelined shm blocks, slot reuse
SMALL_FUSION = {"COMMLIB_FUSION_THRESHOLD": "512"}  # fused batches split at the threshold
NO_FUSION = {"COMMLIB_FUSION_THRESHOLD": "0"}


def describe(run, limit=6000):
    """The job's output for an assertion message (a str, so that pytest shows
    it whole): the failed checks first, then the ends of stdout and stderr."""
    failed = [line for line in run.stderr.splitlines() if "FAILED" in line]
    parts = [f"exit code {run.returncode}"]
    if failed:
        parts.append(f"--- {len(failed)} FAILED lines (first 40) ---")
        parts.extend(failed[:40])
    parts.append(f"--- stdout (last {limit} chars) ---\n{run.stdout[-limit:]}")
    parts.append(f"--- stderr (last {limit} chars) ---\n{run.stderr[-limit:]}")
    return "\n".join(parts)


def assert_all_ok(run, n):
    assert run.returncode == 0, describe(run)
    missing = [r for r in range(n) if f"rank {r}: OK" not in run.stdout]
    assert not missing, f"ranks {missing} did not print their OK line\n" + describe(run)


def variants(*extra):
    """np in (2, 3) with default settings, plus the given (np, env) cases."""
    cases = [pytest.param(2, {}, id="np2"), pytest.param(3, {}, id="np3")]
    for n, env, name in extra:
        cases.append(pytest.param(n, env, id=f"np{n}-{name}"))
    return cases


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,env", variants((4, {}, "default"), (3, MPI_ALGO, "mpi-algo"),
                                           (3, SMALL_SHM_PIECES, "small-shm-pieces")))
def test_allreduce_matches_numpy(ranks, n, env):
    """Every dtype x op (Sum/Average/Min/Max/Product) x shape (empty, 1
    element, fewer elements than ranks, not divisible by the ranks,
    multi-dim) x prescale/postscale, in place and out of place (input left
    unchanged); 8-bit wrap-around; int64 beyond 2**53; bool Average raises
    TypeError; float16/bfloat16 subnormals and overflow to inf; big messages
    (3M float32, 1M float16 and int64). The 4-rank run and the runs with
    other core settings use fewer shapes and scale factors."""
    args = ("quick",) if n == 4 or env else ()
    run = ranks(n, "coll_allreduce.py", *args, timeout=100, env=env)
    assert_all_ok(run, n)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,env", variants((4, {}, "default"), (3, SMALL_FUSION, "small-fusion"),
                                           (3, NO_FUSION, "no-fusion"), (2, MPI_ALGO, "mpi-algo")))
def test_async_fused_allreduce_and_grouped(ranks, n, env):
    """200 small allreduces of mixed dtypes/ops/scales in flight, synchronized
    in reverse order (fused by the core); named ones synchronized shuffled,
    with a big allreduce and every other collective in flight; poll and
    double synchronize; grouped_allreduce / grouped_allreduce_ (in place)
    with mixed dtypes, scaling, two groups in flight; repeated bursts."""
    run = ranks(n, "coll_async.py", timeout=100, env=env)
    assert_all_ok(run, n)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_zero_dim_scalars(ranks, n):
    """0-d arrays, numpy scalars and Python scalars keep the shape () through
    allreduce / allreduce_ / allreduce_async / grouped_allreduce / broadcast /
    broadcast_; allgather, alltoall and reducescatter refuse 0-d arrays with
    ValueError on every rank."""
    run = ranks(n, "coll_scalars.py", timeout=100)
    assert_all_ok(run, n)


# COMMLIB_SHM_COLLECTIVES=always forces the shared-memory broadcast,
# allgather, alltoall and reducescatter at every size (by default only where
# they pay); =never sends them all through MPI.
SHM_ALWAYS = {"COMMLIB_SHM_COLLECTIVES": "always"}
MPI_ONLY = {"COMMLIB_SHM_COLLECTIVES": "never"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,env", [(2, {}), (3, {}), (4, {}), (3, SHM_ALWAYS), (3, MPI_ONLY)])
def test_allgather_and_broadcast(ranks, n, env):
    """allgather with dimension 0 differing per rank (ranks with 0 rows, all
    empty, one rank only), trailing dims incl. 0, every dtype, 60 in flight,
    a big uneven one; broadcast from every root, every dtype, in place and out
    of place (non-root inputs unchanged), numpy int root, all roots in flight,
    3M elements."""
    run = ranks(n, "coll_allgather_bcast.py", timeout=100, env=env)
    assert_all_ok(run, n)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,env", [(2, {}), (3, {}), (4, {}), (2, SHM_ALWAYS), (3, SHM_ALWAYS), (3, MPI_ONLY),
                                   (3, {"COMMLIB_SHM_FUSION_BYTES": "1024"})])
def test_alltoall_and_reducescatter(ranks, n, env):
    """alltoall with equal splits and explicit splits (zeros, one-hot, to
    self, list/tuple/ndarray), received splits, 40 in flight, a big one, bad
    splits refused on every rank; reducescatter for every dtype and op with
    dimension 0 in {0, n, 2n+1, 3n-1, 5n+2}, trailing dims, scaling,
    default op Average, bool Average refused, 40 in flight, 3M elements;
    explicit splits (uneven, zeros, one rank keeping all, big, into out=),
    bad splits refused on every rank, splits differing across ranks a
    mismatch on every rank;
    with 1 KiB shared-memory regions, the reducescatter runs in many blocks
    of a few elements of every rank's slice, and the small alltoalls in
    windows of 320 bytes a destination; MPI_ONLY: MPI's alltoall for equal
    splits and alltoallv for the others."""
    run = ranks(n, "coll_alltoall_rs.py", timeout=100, env=env)
    assert_all_ok(run, n)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_reducescatter_dim0_smaller_than_size(ranks, n):
    """reducescatter with fewer rows than ranks: the first dim0 ranks get a
    row each, the others an empty array (every dtype and op)."""
    run = ranks(n, "coll_alltoall_rs.py", "small", timeout=100)
    assert_all_ok(run, n)


def start_barrier(request, tmp, n):
    return in_background(request.getfixturevalue("ranks"), n, "coll_barrier.py", timeout=100)


# (the rank counts at once: each job mostly sleeps)
barrier_job = started_together("test_barrier", start_barrier, "barrier_job")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_barrier(barrier_job, n):
    """Ranks reach the barrier at different times (rank r after r*0.2 s, the
    reverse, the coordinator late, the last rank late): nobody leaves before
    the last one arrives. 50 barriers in a row; a barrier with an allreduce
    in flight."""
    run = barrier_job[0]
    assert_all_ok(run, n)

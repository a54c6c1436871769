"""commlib.reducescatter_pieces and ZeRO's gradient reduce-scatter on it, at
2 and 3 ranks (uneven shards), through the shared-memory path and through MPI
(COMMLIB_SHM=0, where the core packs the pieces itself): see
workers/zero_pieces.py."""
import pytest

pytest.importorskip("torch")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,shm", [(2, "1"), (3, "1"), (3, "0")])
def test_zero_pieces(ranks, n, shm):
    ranks(n, "zero_pieces.py", timeout=100, env={"COMMLIB_SHM": shm}).assert_ok(n)

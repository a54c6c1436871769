"""Stage 2's gradient reduce-scatter through small persistent staging slots
and commlib.reducescatter(out=), at 2 and 3 ranks (uneven shards): see
workers/zero_staging.py (bitwise equal to stage 1's whole-bucket
reduce-scatter, a parameter only one rank uses, accumulation, errors)."""
import pytest

pytest.importorskip("torch")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 3])
def test_zero_staging(ranks, n):
    ranks(n, "zero_staging.py", timeout=75).assert_ok(n)

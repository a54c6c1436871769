"""The single-array submission fast path at 2 and 3 ranks (workers/fast_submit.py)."""
import pytest

pytest.importorskip("torch")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_fast_submit_sees_changes(ranks, n):
    ranks(n, "fast_submit.py", timeout=90).assert_ok(n)

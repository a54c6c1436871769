"""The in-place allreduce's short paths and their arguments, and a cached
group layout's checks, at 2 and 3 ranks (workers/fast_submit_args.py)."""
import pytest


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_fast_submit_args(ranks, n):
    ranks(n, "fast_submit_args.py", timeout=90).assert_ok(n)

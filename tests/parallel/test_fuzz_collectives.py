"""Hypothesis fuzzing of the numpy API's collectives at 2 and 3 ranks (see
workers/fuzz_numpy.py): 10 examples for each of allreduce, allgather,
broadcast, alltoall and reducescatter, the same on every rank, each rank's
result checked against numpy, and the replicated results bitwise identical
across ranks."""
import re

import pytest

pytest.importorskip("hypothesis")

PER_COLLECTIVE = 10


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [2, 3])
def test_fuzz_numpy_collectives(ranks, n):
    run = ranks(n, "fuzz_numpy.py", str(PER_COLLECTIVE), timeout=60)
    run.assert_ok(n)
    counts = re.findall(r"rank \d+: (\d+) examples run", run.stdout)
    assert counts == [str(5 * PER_COLLECTIVE)] * n, run

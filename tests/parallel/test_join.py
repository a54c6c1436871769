"""join(): ranks with uneven amounts of data (see workers/join_numpy.py and
workers/join_frameworks.py). Every collective is checked on every rank
against numpy with the joined ranks' zeros / missing rows; with the response
cache on one host (the order log), across pretended hosts, and off."""
import pytest

LAYOUTS = {
    "one-host": {},
    "two-hosts": {"COMMLIB_TEST_RANKS_PER_HOST": "1"},
    "no-cache": {"COMMLIB_CACHE_CAPACITY": "0"},
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_join_numpy_every_collective(ranks, n, layout):
    args = ("cache",) if layout != "no-cache" else ()
    ranks(n, "join_numpy.py", *args, timeout=120, env=LAYOUTS[layout]).assert_ok(n)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n,framework", [(2, "torch"), (3, "torch"), (3, "tf")])  # (TensorFlow: one rank count)
def test_join_frameworks(ranks, n, framework):
    pytest.importorskip("torch" if framework == "torch" else "tensorflow")
    ranks(n, "join_frameworks.py", framework, timeout=150).assert_ok(n)

"""Process sets through the launcher, every rank checking against numpy.

* workers/ps_numpy.py (2 and 3 ranks): the numpy API on static sets from
  init(process_sets=[even, odd]) -- single-rank sets included -- run
  concurrently on disjoint sets: every collective (Average divides by the
  set's size, allgather with different first dimensions, alltoall with
  splits, uneven reducescatter, broadcast from a non-zero root, barrier,
  objects), async ops on a set and on the global set interleaved, per-set
  auto names; refusals (non-members, root outside the set, unregistered
  sets, duplicates, removing the global set, ranks outside the job) and
  CollectiveMismatchError on every rank for mismatched add lists; dynamic
  sets (one from an mpi4py communicator) added and removed twice.
* workers/ps_torch.py (3 ranks): commlib.torch collectives, their
  gradients and the model helpers on a set; DistributedOptimizer(process_set=)
  built on every rank averages over the members only (members match
  training on their combined batch, other ranks train locally).
* workers/ps_tf.py (3 ranks): commlib.tensorflow collectives on a set eagerly
  and in tf.function (including graphs where only members trace set ops
  before a global op), gradients, DistributedGradientTape and the Keras
  DistributedOptimizer with process_set=.
"""
import re

import pytest


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_numpy_process_sets(ranks, n):
    ranks(n, "ps_numpy.py", timeout=90).assert_ok(n)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [3])  # (2 ranks: the numpy case above; the frontend adds no rank-count logic)
def test_torch_process_sets(ranks, n):
    pytest.importorskip("torch")
    run = ranks(n, "ps_torch.py", timeout=120)
    run.assert_ok(n)
    errors = [float(e) for e in re.findall(r"set optimizer relative error (\S+)", run.stdout)]
    assert len(errors) == n and max(errors) <= 1e-5, run


@pytest.mark.timeout(200)
def test_tensorflow_process_sets(ranks):
    pytest.importorskip("tensorflow")
    run = ranks(3, "ps_tf.py", timeout=170)
    run.assert_ok(3)
    errors = [float(e) for e in re.findall(r"on a set relative error (\S+)", run.stdout)]
    assert len(errors) == 3 * 3 and max(errors) <= 1e-5, run

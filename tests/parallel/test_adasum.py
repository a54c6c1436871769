"""op=Adasum (adaptive summation, Horovod's definition; commlib.ops's docstring)
against a numpy implementation of the formula (workers/adasum_reference.py)
on 2, 3 and 4 ranks (3: the fold-in of a rank beyond the power of two; the
process set of ranks 1..n-1 covers 1, 2 and 3 ranks): numpy collectives
(workers/adasum_numpy.py), commlib.torch's collectives and
DistributedOptimizer(op=Adasum) (workers/adasum_torch.py), commlib.tensorflow's
and the Keras DistributedOptimizer(op=Adasum) (workers/adasum_keras.py). Every
worker checks that every rank holds bitwise identical results and, for the
optimizers, identical replicas after every step."""
import re

import pytest


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,env", [(2, {}), (3, {}), (4, {}),
                                   (3, {"COMMLIB_FUSION_THRESHOLD": "512"})],
                         ids=["np2", "np3", "np4", "np3-small-fusion"])
def test_adasum_numpy(ranks, n, env):
    """(small fusion: the fused tensors split into several windows)"""
    run = ranks(n, "adasum_numpy.py", timeout=90, env=env)
    run.assert_ok(n)


# (worker, module it needs, the line with its optimizer's errors, the largest allowed)
OPTIMIZERS = {"torch": ("adasum_torch.py", "torch",
                        r"Adasum optimizer max relative error SGD (\S+), Adam (\S+)", 1e-9),
              "keras": ("adasum_keras.py", "tensorflow", r"Keras Adasum max relative error (\S+)",
                        1e-5)}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("frontend,n", [("torch", 2), ("torch", 3), ("keras", 3)])  # (TensorFlow: one rank count)
def test_adasum_frontend_and_optimizer(ranks, frontend, n):
    worker, module, pattern, limit = OPTIMIZERS[frontend]
    pytest.importorskip(module)
    run = ranks(n, worker, timeout=170)
    run.assert_ok(n)
    m = re.search(pattern, run.stdout)
    assert m and all(float(e) <= limit for e in m.groups()), run

"""Horovod's reducescatter gradients in commlib.tensorflow on 2 and 3 ranks
(workers/tf_reducescatter_grad.py): every op and scale factors, eagerly and
inside tf.function, global set and a subset, single and grouped forms."""
import pytest

pytest.importorskip("tensorflow")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_tensorflow_reducescatter_gradients(ranks, n):
    run = ranks(n, "tf_reducescatter_grad.py", timeout=120)
    run.assert_ok(n)

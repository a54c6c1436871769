"""Horovod's reducescatter gradients in commlib.tensorflow on 3 ranks
(workers/tf_reducescatter_grad.py): every op and scale factors, eagerly and
inside tf.function, global set and a subset, single and grouped forms."""
import pytest

pytest.importorskip("tensorflow")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [3])  # (TensorFlow's start dominates: one rank count; the core's algorithms run at 2-4 ranks elsewhere)
def test_tensorflow_reducescatter_gradients(ranks, n):
    run = ranks(n, "tf_reducescatter_grad.py", timeout=120)
    run.assert_ok(n)

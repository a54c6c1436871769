"""commlib.torch (2 and 3 ranks) and commlib.tensorflow (3) send/recv (see
workers/torch_p2p.py and workers/tf_p2p.py): every dtype and shape checked
on the receiver, shapes that change between messages and between calls of
one traced tf.function, autograd pairs (a chain of ranks and a
differentiable ring) against gradients computed in one process, and the
error paths."""
import pytest


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [2, 3])
def test_torch_send_recv_and_autograd(ranks, n):
    pytest.importorskip("torch")
    ranks(n, "torch_p2p.py", timeout=120).assert_ok(n)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n", [3])  # (TensorFlow's start dominates: one rank count; the core's algorithms run at 2-4 ranks elsewhere)
def test_tensorflow_send_recv_and_gradient_tape(ranks, n):
    pytest.importorskip("tensorflow")
    ranks(n, "tf_p2p.py", timeout=120).assert_ok(n)

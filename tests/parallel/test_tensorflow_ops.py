"""commlib.tensorflow collectives on 3 ranks (workers/tf_ops.py), each
rank checking against numpy: allreduce (every op), grouped_allreduce,
allgather, broadcast, alltoall, reducescatter for every dtype, eagerly and
inside tf.function (run twice; retraced with rank-dependent shapes; in a
while loop); their gradients; IndexedSlices; broadcast_variables,
broadcast_, objects, barrier; CollectiveMismatchError eagerly and in graphs
(also a tf.errors.FailedPreconditionError there); TypeError for unsupported dtypes
(also at trace time); Adasum, bad or unregistered process sets, roots, XLA
refused."""
import pytest

pytest.importorskip("tensorflow")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [3])  # (TensorFlow's start dominates: one rank count; the core's algorithms run at 2-4 ranks elsewhere)
def test_tensorflow_collectives(ranks, n):
    run = ranks(n, "tf_ops.py", timeout=170)
    run.assert_ok(n)

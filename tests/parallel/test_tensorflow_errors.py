"""commlib.tensorflow's collective errors are both commlib's class and the
tf.errors class Horovod raises (FailedPreconditionError for ranks that
disagree), eagerly and inside tf.function, on every rank; and generated names
stay in step after them: a shape or dtype mismatch in tf.function and eagerly,
tf.function on one rank's path only, a bad argument on one rank (eagerly and
while tracing: the others fail at once, told by it; a bad root, a complex
dtype, to broadcast, broadcast_variables and a sparse allreduce, named and
unnamed), each followed by unnamed collectives of every kind, eager and in
tf.function, checked against numpy (workers/tf_errors.py). A short
COMMLIB_TIMEOUT makes names that drift apart fail fast."""
import pytest

pytest.importorskip("tensorflow")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [3])  # (TensorFlow's start dominates: one rank count)
def test_tensorflow_errors_and_names_in_step(ranks, n):
    run = ranks(n, "tf_errors.py", timeout=150, env={"COMMLIB_TIMEOUT": "3"})
    run.assert_ok(n)

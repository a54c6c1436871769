"""commlib.tensorflow collectives on 3 ranks (workers/tf_ops.py), each
rank checking against numpy: allreduce (every op), grouped_allreduce,
allgather, broadcast, alltoall, reducescatter for every dtype, eagerly and
inside tf.function (run twice; retraced with rank-dependent shapes; in a
while loop); their gradients; IndexedSlices; broadcast_variables,
broadcast_, objects, barrier; CollectiveMismatchError eagerly and in graphs
(also a tf.errors.FailedPreconditionError there); TypeError for unsupported dtypes
(also at trace time); Adasum, bad or unregistered process sets, roots, XLA
refused. Horovod's reducescatter gradients (workers/tf_reducescatter_grad.py):
every op and scale factors, eagerly and inside tf.function, global set and a
subset, single and grouped forms.

Both workers run in one job (workers/in_one_job.py: TensorFlow starts once on
each rank); if the first fails, the second's test fails as well."""
import pytest
from one_job import scripts_in_one_job

pytest.importorskip("tensorflow")

one_job = scripts_in_one_job("tf_ops.py", "tf_reducescatter_grad.py", timeout=250)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [3])  # (TensorFlow's start dominates: one rank count; the core's algorithms run at 2-4 ranks elsewhere)
def test_tensorflow_collectives(one_job, n):
    one_job(n).assert_script_ok("tf_ops.py", n)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [3])
def test_tensorflow_reducescatter_gradients(one_job, n):
    one_job(n).assert_script_ok("tf_reducescatter_grad.py", n)

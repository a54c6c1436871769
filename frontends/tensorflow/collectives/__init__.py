"""Collectives on tf.Tensor / tf.Variable, eagerly and inside tf.function.

Eagerly, a collective converts its input to numpy, calls commlib's numpy API
and converts back; commlib's exceptions (CollectiveMismatchError, TypeError,
...) reach the caller unchanged.

Every collective takes ``process_set`` (None or ``global_process_set``: every
rank; or a ProcessSet registered with add_process_set /
init(process_sets=[...])): only the set's members call it -- a non-member
gets ValueError, at trace time inside tf.function -- Average divides by the
set's size, rows are ordered by the set's ranks, and broadcast's root_rank is
a job rank in the set. Gradients are collectives over the same set.

Inside tf.function each collective becomes one ``tf.numpy_function`` op
(stateful, so it always runs, even when its result is unused) whose output
dtype and static shape are set at trace time (allgather/alltoall: dimension 0
unknown). Two rules keep ranks in step:

* names are fixed at trace time and derived from the graph only: the traced
  function's name, the op's name scope and a per-graph (and per process
  set) counter, so every
  execution of a traced graph uses the same names on every rank, and a
  retrace (e.g. for another batch shape on one rank only) reproduces them;
* within one graph, every commlib op gets a control dependency on the
  previous one, so they execute in program order even with many inter-op
  threads (TF's automatic control dependencies already order stateful ops;
  this makes it explicit).

A collective's commlib error (CollectiveMismatchError, CollectiveTimeoutError,
...) is raised, eagerly and from graph execution alike, as a class deriving
from both it and the tf.errors class Horovod raises (FailedPreconditionError
for ranks that disagree; see ``errors``); other errors inside a graph op
surface as TensorFlow makes them (InvalidArgumentError for
ValueError/TypeError). Bad dtypes are refused with TypeError at trace time,
before anything is sent. Generated names (``name=None``) stay in step across
ranks after any error, eager or graph (see ``execution.collective_call``).

How a collective runs eagerly or as a graph op (names, ordering, dtypes) is
in ``execution``; the modules of this package build Horovod's collectives on it:
raw (gradient-free forms and shared helpers), allreduce, gather (allgather,
alltoall), broadcast, reducescatter, control (barrier, join, topology as ops),
state_sync (broadcast_variables, the object collectives). commlib.tensorflow
and commlib.tensorflow.mpi_ops re-export the public names.

Gradients (``tf.custom_gradient``) are the adjoints of the collectives, i.e.
gradients of the sum over ranks of each rank's loss: allreduce -> allreduce of
the upstream gradient with the same op and scale factors (Min/Max: routed to
the rank(s) holding the extreme); allgather -> this rank's rows of the summed
upstream gradient; broadcast -> the summed upstream gradient on the root,
zeros elsewhere (Horovod's original definition; recent Horovod averages
instead of summing for allgather and broadcast: set raw.GRAD_GATHER_OP);
alltoall -> alltoall back with the received splits; reducescatter ->
Horovod's: allgather of the upstream gradient times the set's size for Sum
and prescale * postscale for every op.

XLA-compiled functions (jit_compile=True) cannot contain these ops; they are
refused with a clear error at trace time.
"""

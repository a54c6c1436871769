"""Exceptions raised by commlib. Every failure a user can cause is one of these
(or a TypeError/ValueError for bad arguments), raised on the rank concerned."""


class CommlibError(RuntimeError):
    """Base class of commlib's own errors."""


class CollectiveMismatchError(CommlibError):
    """Ranks submitted a collective of the same name with different arguments
    (operation, shape, dtype, reduction op, root or scale factors). The
    message names the tensor, the field and the ranks that differ. No data
    was exchanged; the process stays usable."""


class NotInitializedError(CommlibError, ValueError):
    """commlib.init() has not been called, or shutdown() ended the job's
    communication (on this rank or on the coordinator)."""


class RankLostError(CommlibError):
    """A rank of the job died; the message names it. Communication is over:
    the job should end."""


class CollectiveTimeoutError(CommlibError, TimeoutError):
    """A collective or receive could not complete within COMMLIB_TIMEOUT
    seconds because some ranks never took part (they failed, froze, are
    unreachable, or called other collectives). The message names the
    operation, the tensor, the process set and the missing ranks. On a rank
    whose coordinator (rank 0) stopped answering, communication is over."""


class ScalarTensorError(CommlibError, ValueError):
    """A collective that splits or concatenates along dimension 0
    (allgather, alltoall, reducescatter) got a 0-d tensor. It is a ValueError
    and, like Horovod's error for this case, a HorovodInternalError."""


# horovod.torch / horovod.tensorflow scripts catch these by name.
HorovodInternalError = CommlibError


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's elastic-training signal that the set of hosts changed.
    commlib's elastic mode restarts the whole job instead and never raises
    it; the class exists so that Horovod scripts whose ``except`` clauses
    name it run unchanged."""

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

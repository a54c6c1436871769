"""Horovod's ``horovod.tensorflow.mpi_ops`` names, re-exported from
commlib.tensorflow.collectives (where the collectives and their gradients are
described)."""
from commlib.ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 - re-exported
from commlib.process_sets import (  # noqa: F401 - re-exported
    check_process_set, global_process_set, included, process_set_by_id, set_rank, set_size)

from .collectives.allreduce import allreduce, allreduce_sparse, grouped_allreduce  # noqa: F401
from .collectives.broadcast import broadcast, broadcast_  # noqa: F401 - re-exported
from .collectives.control import (barrier, join, local_rank_op, local_size_op,  # noqa: F401
                                  process_set_included_op, rank_op, size_op)
from .collectives.gather import allgather, alltoall, grouped_allgather  # noqa: F401 - re-exported
from .collectives.raw import (grouped_allgather_raw, grouped_allreduce_raw,  # noqa: F401
                              reducescatter_raw)
from .collectives.reducescatter import grouped_reducescatter, reducescatter  # noqa: F401
from .compression import Compression  # noqa: F401 - re-exported

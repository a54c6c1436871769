"""Everything framework-free that the framework frontends (commlib.torch,
commlib.tensorflow) share, in one namespace. It only gathers names from the
modules where they belong:

* ``reduce_args``: Horovod's ``op``/``average`` and gradient_predivide_factor;
* ``grouping``: gradient groups (``num_groups``/``groups``);
* ``process_sets``: the sets, their checks and per-set sizes;
* ``ops``: generated names, broadcast's root check, how alltoall and
  reducescatter divide dimension 0;
* ``basics`` and ``capabilities``: Horovod's init, topology and build queries;
* ``timeline``: start_timeline/stop_timeline.

The frontends import those modules directly; this one is kept for code
written against it. Nothing here imports a framework.
"""
from __future__ import annotations

from .basics import init, is_homogeneous  # noqa: F401
from .capabilities import (  # noqa: F401
    ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, mpi_built, mpi_enabled,
    nccl_built, rocm_built)
from .grouping import group_indices, resolve_groups, split_list  # noqa: F401
from .ops import (Adasum, auto_name, check_root, even_splits, op_name,  # noqa: F401
                  reducescatter_rows)
from .process_sets import (ProcessSet, add_process_set, check_process_set,  # noqa: F401
                           global_process_set, included, process_set_by_id, remove_process_set,
                           set_rank, set_size)
from .reduce_args import predivide_scales, resolve_op  # noqa: F401
from .timeline import start_timeline, stop_timeline  # noqa: F401

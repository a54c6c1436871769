"""sparse_allreduce_async: Horovod's reduction of sparse tensors, as an
allgather of their indices and values (see mpi_ops)."""
from __future__ import annotations

import torch

from commlib.ops import Average, Sum
from commlib.process_sets import check_process_set, global_process_set, set_size
from commlib.reduce_args import resolve_op

from .gather_ops import allgather_async
from .handles import CallableHandle, Handle


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set) -> Handle:
    """Starts reducing a sparse COO tensor over all ranks (of ``process_set``)
    by gathering every rank's indices and values (as Horovod does);
    ``synchronize(handle)`` or, as in Horovod, ``handle()`` returns the sparse
    sum (Sum) or average (Average, over the set's size), uncoalesced."""
    process_set = check_process_set(process_set)
    op = resolve_op(op)
    if op not in (Sum, Average):
        raise ValueError("sparse_allreduce_async supports op=Sum and op=Average only")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError("sparse_allreduce_async expects a sparse COO tensor")
    if tensor.device.type != "cpu":
        raise ValueError(f"sparse_allreduce_async: tensor is on {tensor.device}; commlib.torch "
                         "supports CPU tensors only")
    t = tensor.coalesce()
    indices = t.indices().t().contiguous()  # allgather concatenates along dimension 0
    values = t.values().contiguous()
    hi = allgather_async(indices, name=None if name is None else f"{name}.indices",
                         process_set=process_set)
    hv = allgather_async(values, name=None if name is None else f"{name}.values",
                         process_set=process_set)
    shape = tuple(tensor.shape)
    n = set_size(process_set)

    def finish(outs):
        idx, val = outs
        if op == Average:
            val = val / n
        return torch.sparse_coo_tensor(idx.t(), val, shape, check_invariants=False)

    return CallableHandle.of_group([hi, hv], finish, (indices, values))

"""Tensor parallelism (Megatron-LM's layers and names) on commlib's collectives.

    import commlib.torch as hvd
    from commlib.torch.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    tp = hvd.add_process_set([0, 1])                        # the tensor-parallel group
    fc1 = ColumnParallelLinear(512, 2048, process_set=tp)   # .weight: this rank's 2048/2 rows
    fc2 = RowParallelLinear(2048, 512, process_set=tp)      # .weight: this rank's 2048/2 columns
    y = fc2(torch.relu(fc1(x)))                             # the same y on every rank of tp

Rank i of the set holds slice i. ``ColumnParallelLinear(in, out)`` splits
the output features: its ``weight`` is (out/tp, in) and its output is this
rank's out/tp features (``gather_output=True`` gathers them all).
``RowParallelLinear(in, out)`` splits the input features: its ``weight`` is
(out, in/tp); it takes this rank's in/tp input features
(``input_is_parallel=True``, e.g. a ColumnParallelLinear's output) or splits
a full input, sums the partial products over the set, and adds its bias once
after the sum. ``VocabParallelEmbedding`` splits the rows (vocabulary): each
rank looks up the ids in its range and the set sums the results.

Every layer initialises its slice as the dense layer would its whole
(``nn.Linear``'s uniform bound 1/sqrt(in), ``nn.Embedding``'s normal), and
``load_dense_(weight, bias)`` copies this rank's slice of a dense layer's
tensors. The autograd collectives under them: ``copy_to_parallel_region``
(identity; backward sums the gradient over the set),
``reduce_from_parallel_region`` (sum; backward identity),
``gather_from_parallel_region`` (concatenate the last dimension; backward
keeps this rank's slice) and ``scatter_to_parallel_region`` (this rank's
slice; backward gathers). Every rank of the set calls them in the same order.
Each takes a ``name`` (its backward's: ``name + ".grad"``); without one the
collectives' names are generated. The layers name theirs once each
(commlib.ops.owned_name), so from their third step on they skip negotiation
(the response cache).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from commlib.ops import owned_name
from commlib.process_sets import check_process_set, set_rank, set_size

from .mpi_ops import Sum, allgather_async, allreduce_async, synchronize

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "copy_to_parallel_region", "reduce_from_parallel_region",
           "gather_from_parallel_region", "scatter_to_parallel_region"]


def _sum(x, ps, name=None):
    return synchronize(allreduce_async(x.contiguous(), op=Sum, name=name, process_set=ps))


def _gather_last(x, ps, name=None):
    n = set_size(ps)
    front = x.movedim(-1, 0).contiguous()
    whole = synchronize(allgather_async(front, name=name, process_set=ps))
    return whole.view(n * front.shape[0], *front.shape[1:]).movedim(0, -1).contiguous()


def _my_slice_last(x, ps, name=None):
    n, i = set_size(ps), set_rank(ps)
    if x.shape[-1] % n:
        raise ValueError(f"the last dimension ({x.shape[-1]}) must divide evenly over the "
                         f"tensor-parallel group's {n} ranks")
    k = x.shape[-1] // n
    return x[..., i * k:(i + 1) * k].contiguous()


def _conjugate_pair(name: str, forward, backward):
    """An autograd Function running ``forward(x, set, name)`` and, in
    backward, ``backward(grad, set, name + ".grad")`` (None: generated)."""

    def fwd(ctx, x, ps, cname):
        ctx.ps, ctx.cname = ps, cname
        return forward(x, ps, cname)

    def bwd(ctx, g):
        return backward(g, ctx.ps, None if ctx.cname is None else ctx.cname + ".grad"), None, None

    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(fwd), "backward": staticmethod(bwd)})


_Copy = _conjugate_pair("_Copy", lambda x, ps, name: x.view_as(x), _sum)
_Reduce = _conjugate_pair("_Reduce", _sum, lambda g, ps, name: g)
_Gather = _conjugate_pair("_Gather", _gather_last, _my_slice_last)
_Scatter = _conjugate_pair("_Scatter", _my_slice_last, _gather_last)


def copy_to_parallel_region(x, process_set=None, name=None):
    return _Copy.apply(x, check_process_set(process_set), name)


def reduce_from_parallel_region(x, process_set=None, name=None):
    return _Reduce.apply(x, check_process_set(process_set), name)


def gather_from_parallel_region(x, process_set=None, name=None):
    return _Gather.apply(x, check_process_set(process_set), name)


def scatter_to_parallel_region(x, process_set=None, name=None):
    return _Scatter.apply(x, check_process_set(process_set), name)


def _split(total: int, ps, what: str) -> tuple[int, int]:
    """(this rank's part size, its offset) of ``total`` over the set."""
    n, i = set_size(ps), set_rank(ps)
    if total % n:
        raise ValueError(f"{what} ({total}) must divide evenly over the tensor-parallel "
                         f"group's {n} ranks")
    return total // n, i * (total // n)


class _ParallelLinear(torch.nn.Module):
    def _make(self, in_features, out_features, bias_size, weight_shape, process_set):
        self.in_features, self.out_features = in_features, out_features
        self.process_set = check_process_set(process_set)
        bound = 1.0 / math.sqrt(in_features)  # nn.Linear's, for the whole layer
        self.weight = torch.nn.Parameter(torch.empty(weight_shape).uniform_(-bound, bound))
        self.bias = (torch.nn.Parameter(torch.empty(bias_size).uniform_(-bound, bound))
                     if bias_size else None)


class ColumnParallelLinear(_ParallelLinear):
    """y = x A^T + b with A's rows (output features) split over the set."""

    def __init__(self, in_features, out_features, bias=True, gather_output=False,
                 process_set=None):
        super().__init__()
        ps = check_process_set(process_set)
        self.part, self.offset = _split(out_features, ps, "out_features")
        self._make(in_features, out_features, self.part if bias else 0,
                   (self.part, in_features), ps)
        self.gather_output = gather_output

    def load_dense_(self, weight, bias=None):
        """Copies this rank's rows of a dense (out, in) weight and (out,) bias."""
        rows = slice(self.offset, self.offset + self.part)
        with torch.no_grad():
            self.weight.copy_(weight[rows])
            if self.bias is not None and bias is not None:
                self.bias.copy_(bias[rows])
        return self

    def forward(self, x):
        ps = self.process_set
        y = F.linear(copy_to_parallel_region(x, ps, owned_name(self, "ColumnParallelLinear.copy", ps)),
                     self.weight, self.bias)
        if not self.gather_output:
            return y
        return gather_from_parallel_region(y, ps, owned_name(self, "ColumnParallelLinear.gather", ps))


class RowParallelLinear(_ParallelLinear):
    """y = x A^T + b with A's columns (input features) split over the set."""

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True,
                 process_set=None):
        super().__init__()
        ps = check_process_set(process_set)
        self.part, self.offset = _split(in_features, ps, "in_features")
        self._make(in_features, out_features, out_features if bias else 0,
                   (out_features, self.part), ps)
        self.input_is_parallel = input_is_parallel

    def load_dense_(self, weight, bias=None):
        """Copies this rank's columns of a dense (out, in) weight, and the bias."""
        with torch.no_grad():
            self.weight.copy_(weight[:, self.offset:self.offset + self.part])
            if self.bias is not None and bias is not None:
                self.bias.copy_(bias)
        return self

    def forward(self, x):
        ps = self.process_set
        if not self.input_is_parallel:
            x = scatter_to_parallel_region(x, ps, owned_name(self, "RowParallelLinear.scatter", ps))
        y = reduce_from_parallel_region(F.linear(x, self.weight), ps,
                                        owned_name(self, "RowParallelLinear.reduce", ps))
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(torch.nn.Module):
    """nn.Embedding with the vocabulary (rows) split over the set."""

    def __init__(self, num_embeddings, embedding_dim, process_set=None):
        super().__init__()
        self.process_set = check_process_set(process_set)
        self.part, self.offset = _split(num_embeddings, self.process_set, "num_embeddings")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = torch.nn.Parameter(torch.randn(self.part, embedding_dim))

    def load_dense_(self, weight):
        with torch.no_grad():
            self.weight.copy_(weight[self.offset:self.offset + self.part])
        return self

    def forward(self, ids):
        outside = (ids < self.offset) | (ids >= self.offset + self.part)
        local = (ids - self.offset).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        ps = self.process_set
        return reduce_from_parallel_region(out, ps, owned_name(self, "VocabParallelEmbedding.reduce", ps))

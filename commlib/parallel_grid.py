"""The process sets of 3D parallelism: data x tensor x pipeline.

    grid = ParallelGrid(dp=2, tp=1, pp=2)     # on every rank, collectively; 4 ranks
    stage = PipelineStage(part, grid.pp_rank, 2, process_set=grid.pp_set)
    ... DistributedOptimizer(opt, process_set=grid.dp_set) ...

The job's dp*tp*pp ranks form a grid with the tensor-parallel index
fastest, then the data-parallel one, then the pipeline one (as Megatron-LM):
``rank = (pp_rank * dp + dp_rank) * tp + tp_rank``. ``tp_set`` holds the tp
ranks that share (dp_rank, pp_rank); ``dp_set`` the dp replicas of one
(tp_rank, pp_rank) slice; ``pp_set`` the stages of one (dp_rank, tp_rank)
pipeline. A group of every rank is ``global_process_set``; every other group
is registered with ``add_process_set`` on every rank, in one order, so the
constructor is collective.
"""
from __future__ import annotations

from . import runtime
from .process_sets import ProcessSet, add_process_set, global_process_set

_DIMS = ("dp", "tp", "pp")


class ParallelGrid:
    def __init__(self, dp: int = 1, tp: int = 1, pp: int = 1):
        runtime.require_init()
        for name, value in zip(_DIMS, (dp, tp, pp)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ParallelGrid: {name} must be a positive int, got {value!r}")
        n = runtime.size()
        if dp * tp * pp != n:
            raise ValueError(f"ParallelGrid: dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp}, but the "
                             f"job has {n} ranks")
        self.dp, self.tp, self.pp = dp, tp, pp
        me = runtime.rank()
        self.tp_rank, self.dp_rank, self.pp_rank = me % tp, (me // tp) % dp, me // (tp * dp)
        made: dict[tuple, ProcessSet] = {}
        for dim in _DIMS:  # every group of every dimension, in one order on every rank
            for group in self._groups(dim):
                if group not in made:
                    made[group] = (global_process_set if len(group) == n
                                   else add_process_set(list(group)))
                if me in group:
                    setattr(self, f"{dim}_set", made[group])

    def rank_of(self, dp_rank: int = 0, tp_rank: int = 0, pp_rank: int = 0) -> int:
        """The job rank at these grid coordinates."""
        return (pp_rank * self.dp + dp_rank) * self.tp + tp_rank

    def _groups(self, dim: str) -> list[tuple]:
        groups = []
        if dim == "tp":
            for p in range(self.pp):
                for d in range(self.dp):
                    groups.append(tuple(self.rank_of(d, t, p) for t in range(self.tp)))
        elif dim == "dp":
            for p in range(self.pp):
                for t in range(self.tp):
                    groups.append(tuple(self.rank_of(d, t, p) for d in range(self.dp)))
        else:
            for d in range(self.dp):
                for t in range(self.tp):
                    groups.append(tuple(self.rank_of(d, t, p) for p in range(self.pp)))
        return groups

    def __repr__(self) -> str:
        return (f"ParallelGrid(dp={self.dp}, tp={self.tp}, pp={self.pp}; this rank: "
                f"dp {self.dp_rank}, tp {self.tp_rank}, pp {self.pp_rank})")

"""One pipeline stage: a module, its place in the pipeline, and what it
keeps between a microbatch's forward and its backward."""
from __future__ import annotations

import torch

from commlib.process_sets import check_process_set, global_process_set, members, set_rank


def _index(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"PipelineStage: {what} must be an int, got {type(value).__name__}")
    return value


class PipelineStage:
    """Stage ``stage_index`` of ``num_stages``, run by this rank.

    The pipeline's ranks are ``process_set``'s members (default: every rank),
    p of them; stage s runs on the set's rank s % p (its job rank is
    ``process_set.ranks[s % p]``), so with one stage per rank stage s is on
    rank s of the set, and an interleaved pipeline gives rank r the stages
    r, r + p, r + 2p, ... Between stages travels one tensor (a stage's
    output is the next stage's input); the first stage takes the
    microbatch's inputs, the last one's output goes to the loss."""

    def __init__(self, module: torch.nn.Module, stage_index: int, num_stages: int,
                 process_set=None):
        if not callable(module):
            raise TypeError(f"PipelineStage needs a module, got {type(module).__name__}")
        s, n = _index(stage_index, "stage_index"), _index(num_stages, "num_stages")
        if not 0 <= s < n:
            raise ValueError(f"PipelineStage: stage_index {s} is outside 0..{n - 1}")
        ps = check_process_set(process_set)
        self.process_set = None if ps is global_process_set else ps
        self.group = list(members(ps))
        p = len(self.group)
        if n % p:
            raise ValueError(f"PipelineStage: {n} stages cannot be spread evenly over the "
                             f"pipeline's {p} ranks")
        me = set_rank(ps)
        if s % p != me:
            raise ValueError(f"PipelineStage: stage {s} runs on pipeline rank {s % p} (job rank "
                             f"{self.group[s % p]}), but this is pipeline rank {me} (job rank "
                             f"{self.group[me]}); rank r holds stages r, r+{p}, ...")
        self.module, self.stage_index, self.num_stages = module, s, n
        self.is_first, self.is_last = s == 0, s == n - 1
        self.live_peak = 0
        self.clear()

    @property
    def pipeline_size(self) -> int:
        return len(self.group)

    @property
    def device(self) -> torch.device | None:
        """Where the stage's module lives (its first parameter or buffer),
        so where the tensors it receives go; None for a CPU module."""
        first = next(iter(self.module.parameters()), None) if hasattr(self.module, "parameters") else None
        if first is None and hasattr(self.module, "buffers"):
            first = next(iter(self.module.buffers()), None)
        return None if first is None or first.is_cpu else first.device

    def job_rank(self, stage: int) -> int:
        """The job rank that runs ``stage``."""
        return self.group[stage % len(self.group)]

    def clear(self) -> None:
        """Forgets the step's microbatches (inputs, outputs, losses)."""
        self.inputs: dict[int, tuple] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.losses: dict[int, torch.Tensor] = {}
        self.input_grads: dict[int, torch.Tensor] = {}

    def forward(self, i: int, inputs: tuple, target=None, loss_fn=None) -> torch.Tensor:
        """Runs microbatch ``i`` forward; the last stage computes its loss."""
        out = self.module(*inputs)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"pipeline stage {self.stage_index} returned "
                            f"{type(out).__name__}; a stage passes one tensor to the next")
        self.inputs[i], self.outputs[i] = inputs, out
        self.live_peak = max(self.live_peak, len(self.outputs))
        if self.is_last:
            self.losses[i] = loss_fn(out, target)
        return out

    def backward(self, i: int, grad_output, scale: float) -> None:
        """Runs microbatch ``i`` backward (the last stage from its loss times
        ``scale``, the others from ``grad_output``) and frees what forward
        kept; the input's gradient waits in ``input_grads``."""
        out = self.outputs.pop(i)
        if self.is_last:
            torch.autograd.backward(self.losses[i] * scale)
        elif out.requires_grad:
            torch.autograd.backward(out, grad_output)
        inputs = self.inputs.pop(i)
        if not self.is_first:
            x = inputs[0]
            self.input_grads[i] = x.grad if x.grad is not None else torch.zeros_like(x)

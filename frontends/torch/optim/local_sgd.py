"""Local SGD and DiLoCo (``commlib.torch.LocalSGD``): commlib.local_sgd's
rule with torch's tensors and optimizers."""
from __future__ import annotations

import torch

from commlib.local_sgd import (LocalSGDPlan, LocalSGDRun, MeetingOps, StreamingMeetings,
                               by_name, check_wrapped)
from commlib.process_sets import check_process_set, communicates, instance_name

from .. import mpi_ops as _ops
from ._grad_exchange import PendingGradients, assign_grads, closure_loss
from .streaming import PendingParameters
from ..mpi_ops import Average, global_process_set


class LocalSGD:
    """Wraps an optimizer (not a DistributedOptimizer) for local SGD, or
    DiLoCo with ``outer_optimizer``; an optimizer-like object (``step``,
    ``zero_grad``, ``synchronize``, ``state_dict``, ``load_state_dict``)::

        inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
        outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        opt = hvd.LocalSGD(inner, model, period=8, outer_optimizer=outer)   # DiLoCo
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()            # no gradient is averaged
        opt.synchronize()         # a last meeting (before evaluating or saving)

    Every step the wrapped optimizer steps on this rank's gradients (nothing
    is averaged); after every ``period``-th step (counted from the end of
    the warm-up) the ranks meet in one grouped allreduce of the parameters.
    Without ``outer_optimizer`` they take the average; with one (DiLoCo,
    built on exactly the model's parameters, as torchft's DiLoCo does) every
    rank restarts from the anchor (the parameters after the last meeting)
    with gradient ``anchor - average`` and steps the outer optimizer (its
    step uses ``p.grad`` and restores the inner gradients afterwards). The
    first ``warmup_steps`` steps are synchronous data parallelism.
    ``average_buffers=True`` (default) also averages the model's
    floating-point buffers (BatchNorm's running statistics;
    ``num_batches_tracked`` is left alone) at each meeting.
    ``streaming=True`` overlaps each meeting with the next round (one round
    stale): a rank starts averaging a snapshot of its parameters and trains
    on, then takes the meeting step with that average and keeps its own
    progress since the snapshot. ``synchronize()`` holds a meeting now
    (applying a pending streaming average first): call it before evaluating
    or saving. The inner optimizer's state stays local. See commlib.local_sgd
    for the exact rule. Construction is collective over
    ``process_set`` (the model's parameters and the options are checked
    across ranks: CollectiveMismatchError if they differ)."""

    def __init__(self, optimizer, model, period, outer_optimizer=None, warmup_steps=0,
                 process_set=global_process_set, streaming=False, average_buffers=True):
        self.process_set = check_process_set(process_set, member=False)
        check_wrapped(optimizer, model, outer_optimizer,
                      (torch.optim.Optimizer, "torch.optim.Optimizer"),
                      (torch.nn.Module, "torch.nn.Module"), TypeError)
        from .optimizer import DistributedOptimizerBase

        if isinstance(optimizer, DistributedOptimizerBase):
            raise ValueError("LocalSGD wraps a plain optimizer: a DistributedOptimizer would "
                             "average every step's gradients")
        self.plan = LocalSGDPlan(period, warmup_steps, streaming, average_buffers,
                                 outer_optimizer, optimizer)
        for k in ("period", "warmup_steps", "streaming", "average_buffers"):
            setattr(self, k, getattr(self.plan, k))
        self.optimizer, self.outer_optimizer = optimizer, outer_optimizer
        names, self._params = by_name(model.named_parameters())
        if not self._params:
            raise ValueError("the model has no parameters")
        buffer_names, buffers = by_name(model.named_buffers() if average_buffers else [],
                                        torch.is_floating_point)
        for n, t in zip(names, self._params):
            _ops.check_tensor(t, f"LocalSGD (parameter {n!r})", inplace=True)
        for n, t in zip(buffer_names, buffers):
            _ops.check_tensor(t, f"LocalSGD (buffer {n!r}; average_buffers=False leaves the "
                              f"buffers alone)", inplace=True)
        if outer_optimizer is not None:
            self._check_outer(outer_optimizer)
        self._reduces = communicates(self.process_set)
        self._prefix = instance_name("localsgd", self.process_set)
        ops = MeetingOps(torch.Tensor.copy_, torch.Tensor.add_,
                         self._outer_step if outer_optimizer is not None else None,
                         copy=lambda t: t.detach().clone(), average=self._average)
        stream = StreamingMeetings(lambda values: PendingParameters(
            values, name=f"{self._prefix}:stream", process_set=self.process_set,
            communicate=self._reduces)) if self.streaming else None
        self._run = LocalSGDRun(self.plan, ops, self._params, buffers, stream)
        self.plan.check_same_everywhere(
            zip(names, self._params), zip(buffer_names, buffers),
            f"{self._prefix}:signature", self.process_set)

    def _check_outer(self, outer):
        outer_ids = {id(p) for g in outer.param_groups for p in g["params"]}
        if outer_ids != {id(p) for p in self._params}:
            raise ValueError("outer_optimizer must be built on exactly the model's parameters, "
                             "e.g. torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, "
                             "nesterov=True)")

    def _outer_step(self, grads, params):
        inner_grads = [p.grad for p in params]
        assign_grads(params, grads)
        self.outer_optimizer.step()
        assign_grads(params, inner_grads)

    # ------------------------------------------------------------ optimizer API

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        """One step of the schedule: synchronous during warm-up, else a local
        step of the inner optimizer followed by a meeting after every
        ``period``-th local step."""
        loss = closure_loss(closure)
        with torch.no_grad():
            self._run.run_step(self._inner_step)
        return loss

    def _inner_step(self, in_warmup):
        if in_warmup:
            pending = PendingGradients(self._params, name=f"{self._prefix}:grads",
                                       process_set=self.process_set, communicate=self._reduces)
            assign_grads(self._params, pending.wait())
        self.optimizer.step()

    def _average(self, tensors):
        if self._reduces:
            _ops.grouped_allreduce_(tensors, name=f"{self._prefix}:params", op=Average,
                                    process_set=self.process_set)
        return tensors

    @torch.no_grad()
    def synchronize(self):
        """Applies a pending streaming average, then holds a meeting now if
        there were local steps since the last one."""
        self._run.synchronize()

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """The inner and outer optimizers' state, the step counters and the
        anchor (DiLoCo); not a pending streaming average (synchronize()
        first)."""
        return {"optimizer": self.optimizer.state_dict(),
                "outer_optimizer": (self.outer_optimizer.state_dict()
                                    if self.outer_optimizer is not None else None),
                **self._run.state()}

    def load_state_dict(self, state: dict) -> None:
        self._run.forget()  # a pending meeting belongs to the state before
        self.optimizer.load_state_dict(state["optimizer"])
        if self.outer_optimizer is not None and state.get("outer_optimizer") is not None:
            self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self._run.load_state(state)

    def __repr__(self):
        return f"<commlib.torch.LocalSGD {self.plan.describe(self._run.step)}>"

"""Local SGD and DiLoCo: ranks train on their own data and meet every
``period`` steps. The rule (schedule, DiLoCo's outer step, streaming
meetings, buffers) is commlib.local_sgd's; this is its torch adapter.

    model = Net()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    opt = hvd.LocalSGD(inner, model, period=8, outer_optimizer=outer)   # DiLoCo
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()            # no gradient is averaged
    opt.synchronize()         # a last meeting (before evaluating or saving)

The averaged buffers are the model's floating-point ones (BatchNorm's running
statistics; ``num_batches_tracked`` is left alone). The outer optimizer must
be built on exactly the model's parameters (as torchft's DiLoCo does); its
step uses ``p.grad`` and restores the inner gradients afterwards.
"""
from __future__ import annotations

import collections
import itertools

import torch

from commlib.delayed import OneStepDelay
from commlib.local_sgd import LocalSGDPlan, MeetingOps, meeting_step, streaming_step
from commlib.process_sets import check_process_set, included, set_size

from .. import mpi_ops as _ops
from ._grad_exchange import PendingGradients, assign_grads
from .streaming import PendingParameters
from ..mpi_ops import Average, global_process_set

_instances = collections.defaultdict(itertools.count)


def _sorted_by_name(named, check=lambda t: True):
    """(names, tensors) of ``named`` (name, tensor) pairs, each tensor once, by name."""
    first = {}
    for n, t in named:
        if t is not None and check(t):
            first.setdefault(t, n)
    by_name = {n: t for t, n in first.items()}
    names = sorted(by_name)
    return names, [by_name[n] for n in names]


class LocalSGD:
    """Wraps an optimizer (not a DistributedOptimizer) for local SGD, or
    DiLoCo with ``outer_optimizer``; an optimizer-like object (``step``,
    ``zero_grad``, ``synchronize``, ``state_dict``, ``load_state_dict``).

        opt = hvd.LocalSGD(torch.optim.AdamW(model.parameters()), model, period=8)

    Every step the wrapped optimizer steps on this rank's gradients (nothing
    is averaged); after every ``period``-th step (counted from the end of
    the warm-up) the ranks meet in one grouped allreduce of the parameters.
    Without ``outer_optimizer`` they take the average; with one (DiLoCo,
    e.g. ``SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)``,
    built on exactly the model's parameters) every rank restarts from the
    anchor (the parameters after the last meeting) with gradient
    ``anchor - average`` and steps the outer optimizer. The first
    ``warmup_steps`` steps are synchronous data parallelism.
    ``average_buffers=True`` (default) also averages the model's
    floating-point buffers (BatchNorm statistics) at each meeting.
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
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"LocalSGD wraps a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        from .optimizer import DistributedOptimizerBase

        if isinstance(optimizer, DistributedOptimizerBase):
            raise ValueError("LocalSGD wraps a plain optimizer: a DistributedOptimizer would "
                             "average every step's gradients")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.plan = LocalSGDPlan(period, warmup_steps, streaming, average_buffers,
                                 outer_optimizer, optimizer)
        for k in ("period", "warmup_steps", "streaming", "average_buffers"):
            setattr(self, k, getattr(self.plan, k))
        self.optimizer, self.outer_optimizer = optimizer, outer_optimizer
        self._names, self._params = _sorted_by_name(model.named_parameters())
        if not self._params:
            raise ValueError("the model has no parameters")
        self._buffer_names, self._buffers = _sorted_by_name(
            model.named_buffers() if average_buffers else [], torch.is_floating_point)
        for n, t in zip(self._names, self._params):
            _ops.check_tensor(t, f"LocalSGD (parameter {n!r})", inplace=True)
        for n, t in zip(self._buffer_names, self._buffers):
            _ops.check_tensor(t, f"LocalSGD (buffer {n!r}; average_buffers=False leaves the "
                              f"buffers alone)", inplace=True)
        self._averaged = self._params + self._buffers  # what a meeting averages
        if outer_optimizer is not None:
            self._check_outer(outer_optimizer)
        self._meeting_ops = MeetingOps(torch.Tensor.copy_, torch.Tensor.add_, self._outer_step)
        self._reduces = included(self.process_set) and set_size(self.process_set) > 1
        self._prefix = f"localsgd{next(_instances[self.process_set.process_set_id])}"
        self._anchor = None
        self._stream = OneStepDelay()  # the streaming meeting in flight
        self._step = 0
        self._local_steps = 0  # since the last meeting
        if self._reduces:
            self.plan.check_same_everywhere(
                [(n, tuple(t.shape), str(t.dtype)) for n, t in zip(self._names, self._params)]
                + [(f"buffer {n}", tuple(t.shape), str(t.dtype))
                   for n, t in zip(self._buffer_names, self._buffers)],
                f"{self._prefix}:signature", self.process_set)

    def _check_outer(self, outer):
        if not isinstance(outer, torch.optim.Optimizer):
            raise TypeError(f"outer_optimizer must be a torch.optim.Optimizer, got "
                            f"{type(outer).__name__}")
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
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.plan.in_warmup(self._step):
            pending = PendingGradients(self._params, name=f"{self._prefix}:grads",
                                       process_set=self.process_set, communicate=self._reduces)
            assign_grads(self._params, pending.wait())
            self.optimizer.step()
        else:
            if self._anchor is None and self.outer_optimizer is not None:
                self._anchor = [p.detach().clone() for p in self._params]
            self.optimizer.step()
            self._local_steps += 1
            if self.plan.meets_after(self._step):
                self._stream_meet() if self.plan.streaming else self._meet()
        self._step += 1
        return loss

    def synchronize(self):
        """Applies a pending streaming average, then holds a meeting now if
        there were local steps since the last one."""
        self._finish_stream()
        if self._local_steps:
            self._meet()

    # ------------------------------------------------------------ meetings

    @torch.no_grad()
    def _meet(self):
        """Averages the parameters (and buffers) across ranks in place and
        takes the meeting step with the average."""
        self._local_steps = 0
        if self._reduces:
            _ops.grouped_allreduce_(self._averaged, name=f"{self._prefix}:params", op=Average,
                                    process_set=self.process_set)
        meeting_step(self._meeting_ops, self._params, self._buffers, self._averaged,
                     self._anchor)

    @torch.no_grad()
    def _finish_stream(self):
        pending = self._stream.finish()
        if pending is not None:
            streaming_step(self._meeting_ops, self._params, self._buffers, pending.wait(),
                           pending.snapshot, self._anchor)

    def _stream_meet(self):
        self._finish_stream()
        self._local_steps = 0
        self._stream.start(PendingParameters(self._averaged, name=f"{self._prefix}:stream",
                                             process_set=self.process_set,
                                             communicate=self._reduces))

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """The inner and outer optimizers' state, the step counters and the
        anchor (DiLoCo); not a pending streaming average (synchronize()
        first)."""
        return {"optimizer": self.optimizer.state_dict(),
                "outer_optimizer": (self.outer_optimizer.state_dict()
                                    if self.outer_optimizer is not None else None),
                "step": self._step, "local_steps": self._local_steps,
                "anchor": [a.clone() for a in self._anchor] if self._anchor else None}

    def load_state_dict(self, state: dict) -> None:
        self._stream.drop()  # it belongs to the state before
        self.optimizer.load_state_dict(state["optimizer"])
        if self.outer_optimizer is not None and state.get("outer_optimizer") is not None:
            self.outer_optimizer.load_state_dict(state["outer_optimizer"])
        self._step = int(state["step"])
        self._local_steps = int(state["local_steps"])
        anchor = state.get("anchor")
        self._anchor = [a.clone() for a in anchor] if anchor else None

    def __repr__(self):
        kind = "DiLoCo" if self.outer_optimizer is not None else "LocalSGD"
        return (f"<commlib.torch.LocalSGD {kind} period={self.period} "
                f"warmup_steps={self.warmup_steps} streaming={self.streaming} "
                f"average_buffers={self.average_buffers} step={self._step}>")

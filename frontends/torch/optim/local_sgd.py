"""Local SGD and DiLoCo: ranks train on their own data and meet every
``period`` steps.

    model = Net()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    opt = hvd.LocalSGD(inner, model, period=8, outer_optimizer=outer)   # DiLoCo
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()            # no gradient is averaged

The rule, with steps counted t = 0, 1, ... from the end of the warm-up:

- every step, the wrapped (inner) optimizer steps on this rank's gradients;
- after the steps with (t + 1) mod period = 0 the ranks meet (one grouped
  allreduce of the parameters):
  - without ``outer_optimizer`` (local SGD) every rank takes the average of
    the parameters;
  - with it (DiLoCo) every rank sets its parameters to the anchor (the
    parameters after the last meeting; at first the ones the local phase
    started from) with gradient ``anchor - average``, steps the outer
    optimizer, and the result is the new anchor that every rank continues
    from.
- ``warmup_steps`` first steps are synchronous data parallelism (gradients
  averaged, then the inner optimizer steps; post-local SGD).

The model's floating-point buffers (BatchNorm's running statistics) are
averaged at every meeting too (``average_buffers=True``, the default), so
that after a meeting the replicas are identical in their buffers as well
(torch's PeriodicModelAverager averages parameters only, leaving each rank
its own statistics); the outer optimizer never sees them (DiLoCo's buffers
take the plain average); streaming meetings treat them as parameters.
Integer buffers (``num_batches_tracked``) are left alone: every rank counts
the same steps. During the warm-up the buffers stay local, as with a
DistributedOptimizer.

After every meeting the replicas are identical. ``synchronize()`` holds a
meeting now if there were local steps since the last one (call it before
evaluating or saving); the schedule of the next meetings does not move. The
inner optimizer's state (momentum, Adam moments) stays local to each rank.
The outer optimizer must have been built on exactly the model's parameters
(as torchft's DiLoCo does); the outer step uses ``p.grad`` and restores the
inner gradients afterwards.

``streaming=True`` overlaps each meeting with the next round (one round
stale): at the end of round k every rank starts averaging a snapshot s_k of
its parameters and goes on training; at the end of round k+1 it waits for
that average, takes the meeting step with it (the average, or DiLoCo's outer
step from the anchor), and keeps its own progress since the snapshot:
x <- new + (x - s_k); then it starts averaging its new snapshot. Replicas
then differ by their last round's progress; ``synchronize()`` applies the
pending average and holds a synchronous meeting, after which they are
identical again. Without it every meeting is synchronous.
"""
from __future__ import annotations

import collections
import itertools

import torch

from commlib.process_sets import check_process_set, included, set_size
from commlib.signature import check_same_everywhere

from .. import mpi_ops as _ops
from ._grad_exchange import PendingGradients, assign_grads, settle
from .streaming import PendingParameters
from ..mpi_ops import Average, global_process_set

_instances = collections.defaultdict(itertools.count)


def _positive_int(value, what, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


class LocalSGD:
    """Wraps an optimizer (not a DistributedOptimizer) for local SGD, or
    DiLoCo with ``outer_optimizer``; see the module's docstring. Construction
    is collective over ``process_set`` (the model's parameters and the options
    are checked across ranks: CollectiveMismatchError if they differ)."""

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
        self.period = _positive_int(period, "period", 1)
        self.warmup_steps = _positive_int(warmup_steps, "warmup_steps", 0)
        if not isinstance(streaming, bool):
            raise ValueError(f"streaming must be True or False, got {streaming!r}")
        self.streaming = streaming
        if not isinstance(average_buffers, bool):
            raise ValueError(f"average_buffers must be True or False, got {average_buffers!r}")
        self.average_buffers = average_buffers
        self._stream = None  # PendingParameters of the last streaming meeting
        self.optimizer = optimizer
        self.outer_optimizer = outer_optimizer
        named = {}
        for n, p in model.named_parameters():
            named.setdefault(p, n)
        self._names = sorted(named.values())
        by_name = {n: p for p, n in named.items()}
        self._params = [by_name[n] for n in self._names]
        if not self._params:
            raise ValueError("the model has no parameters")
        for n, p in zip(self._names, self._params):
            _ops.check_tensor(p, f"LocalSGD (parameter {n!r})", inplace=True)
        self._buffer_names, self._buffers = self._float_buffers(model, average_buffers)
        # What a meeting averages: the parameters, then the buffers.
        self._averaged = self._params + self._buffers
        if outer_optimizer is not None:
            self._check_outer(outer_optimizer)
        self._reduces = included(self.process_set) and set_size(self.process_set) > 1
        instance = next(_instances[self.process_set.process_set_id])
        self._prefix = f"localsgd{instance}"
        self._anchor = None
        self._step = 0
        self._local_steps = 0  # since the last meeting
        if self._reduces:
            self._check_same_everywhere()

    @staticmethod
    def _float_buffers(model, wanted):
        """(names, tensors) of the model's floating-point buffers, by name."""
        if not wanted:
            return [], []
        named = {}
        for n, b in model.named_buffers():
            if b is not None and b.is_floating_point():
                named.setdefault(b, n)
        names = sorted(named.values())
        by_name = {n: b for b, n in named.items()}
        buffers = [by_name[n] for n in names]
        for n, b in zip(names, buffers):
            _ops.check_tensor(b, f"LocalSGD (buffer {n!r}; average_buffers=False leaves the "
                              f"buffers alone)", inplace=True)
        return names, buffers

    def _check_outer(self, outer):
        if not isinstance(outer, torch.optim.Optimizer):
            raise TypeError(f"outer_optimizer must be a torch.optim.Optimizer, got "
                            f"{type(outer).__name__}")
        if outer is self.optimizer:
            raise ValueError("outer_optimizer must be a separate optimizer from the inner one")
        outer_ids = {id(p) for g in outer.param_groups for p in g["params"]}
        if outer_ids != {id(p) for p in self._params}:
            raise ValueError("outer_optimizer must be built on exactly the model's parameters, "
                             "e.g. torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, "
                             "nesterov=True)")

    def _signature(self) -> list:
        options = ("options: period, warmup_steps, outer optimizer, streaming, average_buffers",
                   self.period, self.warmup_steps,
                   type(self.outer_optimizer).__name__ if self.outer_optimizer else None,
                   self.streaming, self.average_buffers)
        return ([options] + [(n, tuple(p.shape), str(p.dtype))
                             for n, p in zip(self._names, self._params)]
                + [(f"buffer {n}", tuple(b.shape), str(b.dtype))
                   for n, b in zip(self._buffer_names, self._buffers)])

    def _check_same_everywhere(self):
        check_same_everywhere(self._signature(), "LocalSGD: the model's parameters or buffers "
                              "(name, shape, dtype) or the options (period, warmup_steps, outer "
                              "optimizer, streaming, average_buffers)",
                              name=f"{self._prefix}:signature", process_set=self.process_set)

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
        if self._step < self.warmup_steps:
            pending = PendingGradients(self._params, name=f"{self._prefix}:grads",
                                       process_set=self.process_set, communicate=self._reduces)
            assign_grads(self._params, pending.wait())
            self.optimizer.step()
        else:
            if self._anchor is None and self.outer_optimizer is not None:
                self._anchor = [p.detach().clone() for p in self._params]
            self.optimizer.step()
            self._local_steps += 1
            if (self._step - self.warmup_steps + 1) % self.period == 0:
                if self.streaming:
                    self._stream_meet()
                else:
                    self._meet()
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
        """Averages the parameters (and buffers) across ranks (in place) and,
        with an outer optimizer, takes its step from the anchor."""
        self._local_steps = 0
        if self._reduces:
            _ops.grouped_allreduce_(self._averaged, name=f"{self._prefix}:params", op=Average,
                                    process_set=self.process_set)
        self._outer_step()

    @torch.no_grad()
    def _outer_step(self):
        """With an outer optimizer: from the average in the parameters, the
        outer step from the anchor (the result is the new anchor)."""
        if self.outer_optimizer is None:
            return
        inner_grads = [p.grad for p in self._params]
        for p, a in zip(self._params, self._anchor):
            p.grad = a - p
            p.copy_(a)
        self.outer_optimizer.step()
        for p, a in zip(self._params, self._anchor):
            a.copy_(p)
        assign_grads(self._params, inner_grads)

    @torch.no_grad()
    def _finish_stream(self):
        """Waits for the pending streaming average and takes the meeting step
        with it, keeping this rank's progress since the snapshot."""
        pending = self._stream
        if pending is None:
            return
        average = pending.wait()  # a failed one stays pending: its error again
        self._stream = None
        progress = [p - s for p, s in zip(self._averaged, pending.snapshot)]
        for p, a in zip(self._averaged, average):
            p.copy_(a)
        self._outer_step()
        for p, d in zip(self._averaged, progress):
            p.add_(d)

    def _stream_meet(self):
        """A streaming meeting: the previous one's average is applied, this
        one's starts (see the module's docstring)."""
        self._finish_stream()
        self._local_steps = 0
        self._stream = PendingParameters(self._averaged, name=f"{self._prefix}:stream",
                                         process_set=self.process_set,
                                         communicate=self._reduces)

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
        pending, self._stream = self._stream, None
        settle(pending)  # dropped: it belongs to the state before
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
                f"average_buffers={self.average_buffers} "
                f"step={self._step}>")

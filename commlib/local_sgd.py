"""Local SGD and DiLoCo, written once for every frontend
(``commlib.torch.LocalSGD``, ``commlib.tensorflow.keras.LocalSGD``): the
options, the schedule and the arithmetic of a meeting. The frontend supplies
a small ``MeetingOps`` object (its framework's assignments and its outer
optimizer's step) and does the communication; nothing here imports a
framework.

The rule, with steps counted t = 0, 1, ... from the end of the warm-up:

- every step, the wrapped (inner) optimizer steps on this rank's gradients
  (no gradient is averaged); its state (momentum, Adam moments) stays local;
- after the steps with (t + 1) mod period = 0 the ranks meet (one grouped
  allreduce of the model's weights):
  - without an outer optimizer (local SGD) every rank takes the average;
  - with one (DiLoCo) every rank sets its weights to the anchor (the weights
    after the last meeting; at first those the local phase started from),
    steps the outer optimizer (e.g. SGD, lr=0.7, momentum=0.9, Nesterov)
    with gradient ``anchor - average``, and the result is the new anchor
    that every rank continues from;
- the first ``warmup_steps`` steps are synchronous data parallelism
  (gradients averaged, then the inner optimizer steps; post-local SGD).

The model's floating-point buffers (BatchNorm's running statistics; Keras:
the non-trainable variables of trainable layers) are averaged at every
meeting too when ``average_buffers`` (the default); the outer optimizer never
sees them (DiLoCo's take the plain average) and streaming meetings treat
them as weights. Integer buffers and frozen layers are left alone; during
the warm-up the buffers stay local. After every meeting the replicas are
identical; ``synchronize()`` holds a meeting now if there were local steps
since the last one (the schedule of the next meetings does not move).

``streaming=True`` overlaps each meeting with the next round (one round
stale): at the end of round k every rank starts averaging a snapshot s_k of
its weights and trains on; at the end of round k+1 it waits for that
average, takes the meeting step with it (the average, or DiLoCo's outer step
from the anchor), keeps its own progress since the snapshot:
w <- new + (w - s_k), then starts averaging its new snapshot. Replicas
differ by their last round's progress until ``synchronize()`` (the pending
average, then a synchronous meeting).
"""
from __future__ import annotations

import operator

from .signature import check_same_everywhere


def _integer(value, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def _flag(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be True or False, got {value!r}")
    return value


class MeetingOps:
    """What a meeting's arithmetic needs from a frontend, built from its
    element-wise operations: ``assign(variable, value)`` and ``add(variable,
    delta)`` (in place), ``outer_step(grads, variables)`` (one step of the
    outer optimizer, DiLoCo only) and ``sub(x, y)`` (a new value, x - y)."""

    def __init__(self, assign, add, outer_step=None, sub=operator.sub):
        self._assign, self._add, self.outer_step, self._sub = assign, add, outer_step, sub

    def sub(self, xs, ys) -> list:
        return [self._sub(x, y) for x, y in zip(xs, ys)]

    def assign(self, variables, values) -> None:
        for v, a in zip(variables, values):
            if v is not a:
                self._assign(v, a)

    def add(self, variables, deltas) -> None:
        for v, d in zip(variables, deltas):
            self._add(v, d)


class LocalSGDPlan:
    """The options and the schedule of one LocalSGD (see the module's
    docstring), with the ``outer`` optimizer (DiLoCo; not ``inner``) or None."""

    def __init__(self, period, warmup_steps=0, streaming=False, average_buffers=True,
                 outer=None, inner=None):
        self.period = _integer(period, "period", 1)
        self.warmup_steps = _integer(warmup_steps, "warmup_steps", 0)
        self.streaming = _flag(streaming, "streaming")
        self.average_buffers = _flag(average_buffers, "average_buffers")
        if outer is not None and outer is inner:
            raise ValueError("outer_optimizer must be a separate optimizer from the inner one")
        self.outer = type(outer).__name__ if outer is not None else None

    # The schedule: ``step`` counts every step from 0 (warm-up included); a
    # Python int, or an integer tensor (the results are then bool tensors).

    def in_warmup(self, step):
        return step < self.warmup_steps

    def is_local(self, step):
        return step >= self.warmup_steps

    def meets_after(self, step):
        """Whether the ranks meet after local step ``step``."""
        return (step >= self.warmup_steps) & ((step - self.warmup_steps + 1) % self.period == 0)

    def check_same_everywhere(self, entries, name: str, process_set) -> None:
        """CollectiveMismatchError on every rank if the options or
        ``entries`` (the averaged variables: name, shape, dtype) differ
        across the ranks of ``process_set`` (a meeting on some ranks only
        would otherwise stall)."""
        options = ("options: period, warmup_steps, outer optimizer, streaming, average_buffers",
                   self.period, self.warmup_steps, self.outer, self.streaming,
                   self.average_buffers)
        check_same_everywhere([options] + list(entries), "LocalSGD: the options (period, "
                              "warmup_steps, outer optimizer, streaming, average_buffers) or "
                              "the model's variables (name, shape, dtype)",
                              name=name, process_set=process_set)


def meeting_step(ops, model, buffers, average, anchor=None) -> None:
    """The weights (``model``) and ``buffers`` take the meeting's result from
    ``average`` (the model's averages, then the buffers'): the average or,
    with an ``anchor`` (DiLoCo), the outer step from the anchor with
    gradient anchor - average, which becomes the new anchor."""
    if anchor is None:
        ops.assign(list(model) + list(buffers), average)
        return
    n = len(model)
    ops.assign(buffers, average[n:])
    pseudo = ops.sub(anchor, average[:n])
    ops.assign(model, anchor)
    ops.outer_step(pseudo, model)
    ops.assign(anchor, model)


def streaming_step(ops, model, buffers, average, snapshot, anchor=None) -> None:
    """A streaming meeting's step: meeting_step with the average of the
    ``snapshot``, keeping this rank's progress since the snapshot."""
    variables = list(model) + list(buffers)
    progress = ops.sub(variables, snapshot)
    meeting_step(ops, model, buffers, average, anchor)
    ops.add(variables, progress)

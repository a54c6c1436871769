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

from .delayed import OneStepDelay
from .process_sets import communicates
from .signature import check_same_everywhere


def _integer(value, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def _flag(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be True or False, got {value!r}")
    return value


def check_wrapped(optimizer, model, outer, optimizer_type, model_type, error) -> None:
    """``error`` (the frontend's kind: TypeError in torch, ValueError in
    Keras) unless ``optimizer`` and ``outer`` (or None) are ``optimizer_type``s
    and ``model`` a ``model_type`` (each a (class, name for the message) pair)."""
    checks = [(optimizer, optimizer_type, "LocalSGD wraps"), (model, model_type, "model must be")]
    if outer is not None:
        checks.append((outer, optimizer_type, "outer_optimizer must be"))
    for value, (kind, name), what in checks:
        if not isinstance(value, kind):
            raise error(f"{what} a {name}, got {type(value).__name__}")


def _python_when(pred, fn) -> None:
    if pred:
        fn()


def _python_after(deps, fn) -> None:
    fn()


class MeetingOps:
    """What a LocalSGD needs from a frontend, built from its element-wise
    operations: ``assign(variable, value)`` and ``add(variable, delta)`` (in
    place), ``outer_step(grads, variables)`` (one step of the outer
    optimizer, DiLoCo only), ``sub(x, y)`` (a new value, x - y),
    ``when(pred, fn)`` (fn() when pred holds: a Python bool, or a bool tensor
    in a graph), ``after(deps, fn)`` (fn() once the tensors ``deps`` have
    been computed: a graph does not order a variable's update after an
    unrelated op by itself), ``copy(values)`` (new tensors) and
    ``average(values)`` (the values averaged across the ranks, in place or
    new; None: no one to average with)."""

    def __init__(self, assign, add, outer_step=None, sub=operator.sub, when=_python_when,
                 copy=None, average=None, after=_python_after):
        self._assign, self._add, self.outer_step, self._sub = assign, add, outer_step, sub
        self.when, self._copy, self._average, self.after = when, copy, average, after

    def sub(self, xs, ys) -> list:
        return [self._sub(x, y) for x, y in zip(xs, ys)]

    def assign(self, variables, values) -> None:
        for v, a in zip(variables, values):
            if v is not a:
                self._assign(v, a)

    def add(self, variables, deltas) -> None:
        for v, d in zip(variables, deltas):
            self._add(v, d)

    def copy(self, values) -> list:
        return [self._copy(v) for v in values]

    def average(self, values) -> list:
        return self._average(values) if self._average is not None else values


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

    def check_same_everywhere(self, model, buffers, name: str, process_set) -> None:
        """CollectiveMismatchError on every rank if the options or the
        averaged variables (``model`` and ``buffers``: (name, variable)
        pairs; their shapes and dtypes) differ across the ranks of
        ``process_set`` (a meeting on some ranks only would otherwise
        stall); nothing to check when this rank averages with no one."""
        if not communicates(process_set):
            return
        options = ("options: period, warmup_steps, outer optimizer, streaming, average_buffers",
                   self.period, self.warmup_steps, self.outer, self.streaming,
                   self.average_buffers)
        entries = [(prefix + str(n), tuple(v.shape), str(v.dtype))
                   for prefix, pairs in (("", model), ("buffer ", buffers)) for n, v in pairs]
        check_same_everywhere([options] + entries, "LocalSGD: the options (period, "
                              "warmup_steps, outer optimizer, streaming, average_buffers) or "
                              "the model's variables (name, shape, dtype)",
                              name=name, process_set=process_set)

    def describe(self, step) -> str:
        """The options and ``step``, for a wrapper's repr."""
        return (f"{'DiLoCo' if self.outer else 'LocalSGD'} period={self.period} "
                f"warmup_steps={self.warmup_steps} streaming={self.streaming} "
                f"average_buffers={self.average_buffers} step={int(step)}")


def by_name(named, keep=lambda v: True):
    """(names, variables) of ``named`` (name, variable) pairs that ``keep``
    accepts, each variable once (under its first name), sorted by name."""
    first = {}
    for n, v in named:
        if v is not None and keep(v):
            first.setdefault(id(v), (n, v))
    named_once = dict(first.values())
    names = sorted(named_once)
    return names, [named_once[n] for n in names]


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


class Counter:
    """A step counter with the methods of the tf.Variable a graph counts
    with (``read_value``, ``assign``, ``assign_add``, ``int()``)."""

    def __init__(self, value: int = 0):
        self.value = int(value)

    def read_value(self) -> int:
        return self.value

    def assign(self, value) -> None:
        self.value = int(value)

    def assign_add(self, delta) -> None:
        self.value += int(delta)

    def __int__(self) -> int:
        return self.value


class StreamingMeetings:
    """The streaming meeting in flight (at most one): ``start(values)``
    holds ``begin(values)``, a started average of a snapshot of the values
    (an object with ``inputs``, the snapshot, and ``wait()``, the average);
    ``finish(like)`` waits for it: ``(have, average, snapshot)``."""

    def __init__(self, begin=None):
        self._begin, self._delay = begin, OneStepDelay()

    @property
    def pending(self) -> bool:
        return self._delay.pending

    def start(self, values):
        """Starts averaging ``values``; returns True (a frontend's graph: a
        tensor computed once the average has started)."""
        self._delay.start(self._begin(values))
        return True

    def finish(self, like=None):
        """(True, average, snapshot), or (False, None, None) when none is pending."""
        done = self._delay.finish()
        return (False, None, None) if done is None else (True, done.wait(), done.inputs)

    def drop(self) -> None:
        """Forgets a pending meeting once it has ended (failed or not): the
        weights it was for were replaced."""
        self._delay.drop()


class LocalSGDRun:
    """One LocalSGD's control flow (see the module's docstring) over a
    frontend's ``ops`` (MeetingOps): what each step does, when the ranks
    meet and what they average (the ``model``'s variables, then the
    ``buffers``), the streaming meeting's sequencing (``stream``: a
    StreamingMeetings, or None) and DiLoCo's anchor. ``step`` and
    ``local_steps`` are Counters (or a graph's variables); ``anchor``:
    variables like the model's, or None (DiLoCo then takes copies at the
    first local step)."""

    def __init__(self, plan, ops, model, buffers, stream=None, step=None, local_steps=None,
                 anchor=None):
        self.plan, self.ops, self.stream, self.anchor = plan, ops, stream, anchor
        self.model, self.buffers = list(model), list(buffers)
        self.step = step if step is not None else Counter()
        self.local_steps = local_steps if local_steps is not None else Counter()

    def run_step(self, inner_step) -> None:
        """One step: ``inner_step(in_warmup)`` (the frontend averages the
        gradients when in_warmup holds, then steps the inner optimizer),
        DiLoCo's anchor taken before the first local step, and a meeting
        after every ``period``-th local step."""
        plan, ops, step = self.plan, self.ops, self.step.read_value()
        if ops.outer_step is not None and self.anchor is None:
            if plan.is_local(step):
                self.anchor = ops.copy(self.model)
        elif ops.outer_step is not None:
            ops.when(step == plan.warmup_steps, lambda: ops.assign(self.anchor, self.model))
        inner_step(plan.in_warmup(step))
        self.step.assign_add(1)
        ops.when(plan.is_local(step), lambda: self.local_steps.assign_add(1))
        ops.when(plan.meets_after(step), self._stream_meet if plan.streaming else self.meet)

    def meet(self) -> None:
        """Averages the weights (and buffers) across the ranks and takes the
        meeting step with the average. The local steps are counted as met
        only once the average has arrived: after a failed meeting
        ``synchronize()`` meets again (and raises again)."""
        average = self.ops.average(self.model + self.buffers)
        self.ops.after(average, lambda: self.local_steps.assign(0))
        meeting_step(self.ops, self.model, self.buffers, average, self.anchor)

    def _finish_stream(self) -> None:
        have, average, snapshot = self.stream.finish(self.model + self.buffers)
        self.ops.when(have, lambda: streaming_step(self.ops, self.model, self.buffers, average,
                                                   snapshot, self.anchor))

    def _stream_meet(self) -> None:
        self._finish_stream()
        started = self.stream.start(self.model + self.buffers)
        # (after the start: one that failed leaves them to synchronize())
        self.ops.after([started], lambda: self.local_steps.assign(0))

    def synchronize(self) -> None:
        """Applies a pending streaming average, then holds a meeting now if
        there were local steps since the last one (eagerly)."""
        if self.stream is not None and self.stream.pending:
            self._finish_stream()
        if int(self.local_steps) > 0:
            self.meet()

    def forget(self) -> None:
        """Drops a pending streaming meeting: the weights were replaced."""
        if self.stream is not None:
            self.stream.drop()

    def state(self) -> dict:
        """The counters and DiLoCo's anchor (copies), as a checkpoint holds them."""
        return {"step": int(self.step), "local_steps": int(self.local_steps),
                "anchor": self.ops.copy(self.anchor) if self.anchor else None}

    def load_state(self, state: dict) -> None:
        """Loads ``state()``'s counters and anchor; a pending streaming
        meeting (of the state before) is dropped."""
        self.forget()
        self.step.assign(state["step"])
        self.local_steps.assign(state["local_steps"])
        anchor = state.get("anchor")
        self.anchor = self.ops.copy(anchor) if anchor else None

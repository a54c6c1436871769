"""One-step delayed gradient averaging (``staleness=1``), written once for
every frontend: the torch and Keras ``DistributedOptimizer(...,
staleness=1)`` and TensorFlow's ``DistributedGradientTape(..., staleness=1)``.

The rule: step t computes the gradients g_t at the current weights w_t,
starts averaging them across ranks (one grouped allreduce that the core's
background thread progresses while the caller runs the next forward and
backward) and applies the average of the previous step's gradients with the
wrapped optimizer's rule: for SGD w_{t+1} = w_t - lr * avg(g_{t-1}). Step 0
applies nothing (the wrapped optimizer is not stepped), nor does the step
after ``synchronize()``, which waits for the pending average and applies it
(call it before evaluating or saving). Every rank applies the same average,
so replicas stay identical. At most one average of an optimizer is in
flight: the previous one is waited for before the next one starts, and a
failed one, or one that failed to start, stays pending (its error again at
every step and at ``synchronize()``). On ranks outside
the process set (and on a set of one rank) the same one-step delay applies
to the local gradients. The state a checkpoint saves does not include the
pending average (``synchronize()`` first); restoring drops it.

With weight prediction (opt-in, ``weight_prediction=True``) each step's
gradients are computed at a prediction of the weights they will be applied
to, w + (w - w_prev), instead of at w (``apply_average``): the model holds
the predicted weights between steps and ``synchronize()`` puts the true ones
back.

Here: the option checks, ``DelayedRule`` (what a step and ``synchronize()``
do, over a frontend's update and exchange), ``OneStepDelay`` (the pending exchange between
steps, over anything with a ``wait()``), ``PendingAverage`` (numpy arrays
averaged into buffers of their own) and the gradient layout helpers. Nothing
here imports a framework.
"""
from __future__ import annotations

import numpy as np

from .errors import CommlibError
from .grouped_ops import grouped_allreduce_async
from .handle import synchronize
from .ops import Average, Sum


def check_staleness(staleness, allowed=(1,), refused=None) -> None:
    """ValueError unless ``staleness`` is one of ``allowed`` (ints, not
    bools), or when an option of ``refused`` ({what: whether it is set}) is set."""
    if isinstance(staleness, bool) or staleness not in allowed:
        raise ValueError(f"staleness must be 0 (synchronous) or 1 (one-step delayed "
                         f"averaging), got {staleness!r}")
    bad = [k for k, v in (refused or {}).items() if v]
    if bad:
        raise ValueError(f"staleness=1 cannot be combined with {', '.join(bad)}")


def check_weight_prediction(weight_prediction, staleness) -> None:
    """ValueError unless ``weight_prediction`` is True or False, True only with staleness=1."""
    if not isinstance(weight_prediction, bool):
        raise ValueError(f"weight_prediction must be True or False, got {weight_prediction!r}")
    if weight_prediction and staleness == 0:
        raise ValueError("weight_prediction=True needs staleness=1")


def check_op(op, what: str) -> None:
    """ValueError unless ``op`` is Average or Sum (what a delay averages with)."""
    if op not in (Average, Sum):
        raise ValueError(f"{what} supports op=Average or op=Sum only")


def settle(pending) -> None:
    """Waits for a pending exchange (anything with ``wait()``; None: nothing)
    and drops its result, or its error (a lost rank): what an exchange whose
    weights were replaced ends with."""
    if pending is not None:
        try:
            pending.wait()
        except CommlibError:
            pass


class PendingAverage:
    """Starts averaging the numpy ``arrays`` across ``process_set`` into the
    buffers ``out`` (a copy of them when ``communicate`` is False: no one to
    average with). The arrays are read by the background thread after this
    returns; they are kept alive until ``wait()``."""

    def __init__(self, arrays, out, name, op=Average, scales=(1.0, 1.0), process_set=None,
                 communicate=True):
        self.inputs, self.out, self._handle = arrays, out, None
        if communicate and arrays:
            pre, post = scales
            self._handle = grouped_allreduce_async(arrays, name=name, op=op,
                                                   prescale_factor=pre, postscale_factor=post,
                                                   process_set=process_set, out=out)
        else:
            for o, a in zip(out, arrays):
                np.copyto(o, a)

    def wait(self) -> list:
        """The averaged arrays (``out``); a failed exchange raises again at every wait()."""
        if self._handle is not None:
            synchronize(self._handle)
            self._handle = None
        return self.out


class FailedStart:
    """An exchange that failed to start: waiting for it raises its error."""

    def __init__(self, error: CommlibError):
        self.error = error

    def wait(self):
        raise self.error


class OneStepDelay:
    """The exchange in flight between two steps: at most one."""

    def __init__(self):
        self._pending = None

    @property
    def pending(self) -> bool:
        """Whether an exchange is in flight (started, not finished yet)."""
        return self._pending is not None

    def start(self, pending) -> None:
        """Holds the started exchange ``pending`` (RuntimeError if one is held)."""
        if self._pending is not None:
            raise RuntimeError("an exchange is already pending; finish() it first")
        self._pending = pending

    def finish(self):
        """Waits for the pending exchange and returns it, or None when none
        is pending (a failed one stays pending: its error again)."""
        pending = self._pending
        if pending is not None:
            pending.wait()
            self._pending = None
        return pending

    def begin(self, make) -> None:
        """Holds ``make()``'s new exchange. One that fails to start (a lost
        rank, a timeout: a CommlibError) is held as its error, raised again
        by ``finish()``: the next step and ``synchronize()`` must not go on as
        if this step's exchange had been made."""
        try:
            pending = make()
        except CommlibError as e:
            self.start(FailedStart(e))
            raise
        self.start(pending)

    def swap(self, start):
        """finish(), then holds ``start()``'s new exchange (``begin``);
        returns the finished one."""
        previous = self.finish()
        self.begin(start)
        return previous

    def drop(self) -> None:
        """Forgets the pending exchange once it has ended, failed or not."""
        pending, self._pending = self._pending, None
        settle(pending)


class DelayedArrays:
    """The one-step delay on numpy arrays: ``swap(arrays)`` waits for the
    pending average and starts averaging ``arrays`` into buffers from
    ``take(like)`` (the i-th one of a process set is named alike on every
    rank)."""

    def __init__(self, name, take, op=Average, scales=(1.0, 1.0), process_set=None,
                 communicate=True):
        self.name, self.op, self.scales, self.process_set = name, op, scales, process_set
        self.communicate, self._take, self._delay = communicate, take, OneStepDelay()

    @property
    def pending(self) -> bool:
        return self._delay.pending

    def start(self, arrays) -> None:
        """Starts averaging ``arrays`` (numpy) into buffers of its own."""
        arrays = [np.asarray(a) for a in arrays]
        self._delay.begin(lambda: PendingAverage(arrays, self._take(arrays), self.name, self.op,
                                                 self.scales, self.process_set, self.communicate))

    def finish(self):
        """Waits for the pending average: (True, arrays), or (False, None)."""
        done = self._delay.finish()
        return (False, None) if done is None else (True, done.out)

    def drop(self) -> None:
        """Forgets a pending average once it has ended (failed or not)."""
        self._delay.drop()

    def swap(self, arrays):
        """finish() then start(arrays); the previous average must have the
        same shapes and dtypes (ValueError otherwise)."""
        have, prev = self.finish()
        arrays = [np.asarray(a) for a in arrays]
        if have and [(a.shape, a.dtype) for a in prev] != [(a.shape, a.dtype) for a in arrays]:
            raise ValueError("staleness=1: the gradients of this step do not match the pending "
                             "ones (the variables with a gradient changed between steps)")
        self.start(arrays)  # (into the buffers the previous swap lent out, if released)
        return have, prev


def apply_average(update, prediction=None, predict=False) -> None:
    """``update()`` (the wrapped optimizer's rule) on the true weights; with
    a weight ``prediction`` (before_update/predict/restore) and ``predict``
    the model then holds the predicted weights."""
    if prediction is not None:
        prediction.before_update()
    update()
    if prediction is not None and predict:
        prediction.predict()


def present(grads) -> list:
    """The positions of the gradients that are not None."""
    return [i for i, g in enumerate(grads) if g is not None]


def scatter(count: int, positions, values) -> list:
    """A list of ``count`` Nones with ``values`` at ``positions``."""
    out = [None] * count
    for i, v in zip(positions, values):
        out[i] = v
    return out


def check_tape_options(staleness, delayed, groups, delayed_type) -> None:
    """ValueError for a staleness/delayed combination DistributedGradientTape
    does not take (``delayed`` must be a ``delayed_type`` with staleness=1)."""
    check_staleness(staleness, (0, 1))
    if staleness == 0:
        if delayed is not None:
            raise ValueError("delayed= is for staleness=1")
        return
    if not isinstance(delayed, delayed_type):
        raise ValueError("staleness=1 needs delayed=hvd.DelayedGradients(), created once before "
                         "the training loop (it holds the average between steps)")
    if groups is not None:
        raise ValueError("staleness=1 cannot be combined with groups")


class GradientLayout:
    """Which gradients of a step are not None: the same at every step (the
    average of a step's gradients is applied at the next)."""

    def __init__(self):
        self.count, self.positions = None, None

    def present(self, grads) -> list:
        """The positions of ``grads`` that are not None (ValueError if none
        is, or if they differ from the previous step's)."""
        at = present(grads)
        if not at:
            raise ValueError("staleness=1: no source has a gradient")
        if self.positions is not None and (len(grads), at) != (self.count, self.positions):
            raise ValueError("staleness=1: the sources with a gradient changed between steps "
                             f"(gradients at {at} of {len(grads)}, before "
                             f"{self.positions} of {self.count})")
        self.count, self.positions = len(grads), at
        return at

    def scatter(self, values) -> list:
        """The last step's layout with ``values`` where its gradients were."""
        return scatter(self.count, self.positions, values)


class StartedExchanges:
    """The one-step delay of the exchanges ``begin()`` starts (objects with
    ``wait()``, which returns the averages): ``swap()`` and ``finish()`` give
    ``(have, averages)``."""

    def __init__(self, begin):
        self._begin, self._delay = begin, OneStepDelay()

    @property
    def pending(self) -> bool:
        return self._delay.pending

    def swap(self):
        return _averages(self._delay.swap(self._begin))

    def finish(self):
        return _averages(self._delay.finish())

    def drop(self) -> None:
        self._delay.drop()


def _averages(done):
    return (False, None) if done is None else (True, done.wait())


def _python_when(pred, fn) -> None:
    if pred:
        fn()


class DelayedRule:
    """What ``staleness=1`` does at a step and at ``synchronize()`` (see the
    module's docstring), over a frontend's ``exchange`` (``swap(*args)``:
    waits for the pending average and starts averaging this step's
    gradients, ``(have, averages)``; ``finish()``: the same without a new
    one; ``drop()``; ``pending``), its ``update(averages)`` (the wrapped
    optimizer's rule with those gradients) and ``when(pred, fn)`` (a Python
    if; tf.cond in a graph). ``prediction``: a weight prediction, or None."""

    def __init__(self, exchange, update, when=_python_when, prediction=None):
        self.exchange, self.update, self.when, self.prediction = exchange, update, when, prediction

    @property
    def pending(self) -> bool:
        """Whether an average is in flight (started, not applied yet)."""
        return self.exchange.pending

    def _apply(self, averages, predict) -> None:
        apply_average(lambda: self.update(averages), self.prediction, predict)

    def step(self, *args) -> None:
        """Starts averaging this step's gradients and applies the previous
        step's average (nothing at the first step or after synchronize())."""
        have, averages = self.exchange.swap(*args)
        self.when(have, lambda: self._apply(averages, predict=True))

    def synchronize(self) -> None:
        """Waits for the pending average and applies it (eagerly); the model
        then holds the true weights."""
        have, averages = self.exchange.finish()
        if have:
            self._apply(averages, predict=False)
        elif self.prediction is not None:
            self.prediction.restore()

    def forget(self) -> None:
        """Drops the pending average (waited for, failed or not) and a
        prediction: the weights were replaced."""
        self.exchange.drop()
        if self.prediction is not None:
            self.prediction.drop()

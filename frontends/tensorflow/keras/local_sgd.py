"""Local SGD and DiLoCo for Keras: an optimizer wrapper.

    inner = keras.optimizers.AdamW(1e-3)
    outer = keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
    opt = hvd.LocalSGD(inner, model, period=8, outer_optimizer=outer)   # DiLoCo
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y, ...)
    opt.synchronize()     # a last meeting if steps were taken since the previous one

The rule is commlib.torch.LocalSGD's, with steps counted t = 0, 1, ... from
the end of the warm-up: the inner optimizer steps on this rank's gradients
(no gradient is averaged); after the steps with (t + 1) mod period = 0 the
ranks meet: one grouped allreduce of ``model.trainable_variables``, then
every rank takes the average (local SGD) or, with ``outer_optimizer``
(DiLoCo), sets its weights to the anchor (the weights after the last meeting;
at first those the local phase started from), applies the outer optimizer
with gradient ``anchor - average``, and the result is the new anchor. The
first ``warmup_steps`` steps are synchronous data parallelism (gradients
averaged before the inner step). Replicas are identical after every meeting.

The model's floating-point non-trainable variables of trainable layers
(BatchNormalization's moving mean and variance) are averaged at every
meeting too (``average_buffers=True``, the default; the outer optimizer
never sees them: DiLoCo's take the plain average, streaming meetings treat
them as weights); frozen layers' variables and integer ones are left alone.
During the warm-up they stay local, as with a DistributedOptimizer.

The wrapper is a copy of the inner optimizer (an instance of a subclass of
its class); the schedule runs inside the compiled train step (tf.cond on a
step counter).

``streaming=True`` overlaps each meeting with the next round (one round
stale), as commlib.torch.LocalSGD's: at the end of round k every rank starts
averaging a snapshot s_k of its weights and trains on; at the end of round
k+1 it waits for that average, takes the meeting step with it (the average,
or DiLoCo's outer step from the anchor) and keeps its own progress since the
snapshot: w <- new + (w - s_k); then it starts averaging its new snapshot.
Replicas differ by their last round's progress until ``synchronize()``
(the pending average, then a synchronous meeting if steps were taken since).
"""
from __future__ import annotations

import functools

import keras
import tensorflow as tf

from commlib.ops import Average
from commlib.process_sets import check_process_set, included, set_size
from commlib.signature import check_same_everywhere

from .. import mpi_ops as _ops
from ..gradient_tape import make_allreduce_grads
from ..streaming import StreamingMeetings
from .optimizer_base import own_counter, own_zeros_like, run_if


class _LocalSGDMixin:
    """Placed in front of the inner optimizer's class."""

    def _commlib_local_setup(self, model_vars, buffer_vars, period, outer, warmup, process_set,
                             streaming):
        s = functools.partial(object.__setattr__, self)
        s("_commlib_model_vars", list(model_vars))
        s("_commlib_buffer_vars", list(buffer_vars))
        s("period", period)
        s("warmup_steps", warmup)
        s("outer_optimizer", outer)
        s("process_set", process_set)
        s("streaming", streaming)
        s("_commlib_stream", StreamingMeetings(process_set) if streaming else None)
        s("_commlib_communicate", included(process_set) and set_size(process_set) > 1)
        s("_commlib_allreduce", make_allreduce_grads(op=Average, process_set=process_set,
                                                     name="LocalSGDWarmup"))
        s("_commlib_anchor", None)
        s("_commlib_step", None)
        s("_commlib_local", None)

    def build(self, variables):
        super().build(variables)
        if getattr(self, "_commlib_step", 1) is not None:
            return
        # The schedule's counters and DiLoCo's anchor are not the optimizer's
        # variables (own_zeros_like): KerasState checkpoints them, with the
        # outer optimizer's (commlib_state_variables).
        s = functools.partial(object.__setattr__, self)
        s("_commlib_step", own_counter("commlib_step"))
        s("_commlib_local", own_counter("commlib_local_steps"))
        if self.outer_optimizer is not None:
            s("_commlib_anchor", own_zeros_like(self._commlib_model_vars, "commlib_anchor"))
            self.outer_optimizer.build(self._commlib_model_vars)

    def commlib_state_variables(self) -> list:
        """Training state beyond ``variables`` (the inner optimizer's): the
        counters, the anchor and the outer optimizer's variables, for
        KerasState."""
        if self._commlib_step is None:
            return []
        extra = [self._commlib_step, self._commlib_local] + list(self._commlib_anchor or [])
        if self.outer_optimizer is not None:
            extra += list(self.outer_optimizer.variables)
        return extra

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        variables = (list(trainable_variables) if trainable_variables is not None
                     else list(self._trainable_variables))
        if not self.built:  # before any tf.cond: no variables created in a branch
            with keras.name_scope(self.name, caller=self):
                self.build(variables)
            self.built = True
        step = tf.convert_to_tensor(self._commlib_step)
        if self.warmup_steps:
            grads = self._warmup_grads(grads, variables, step < self.warmup_steps)
        if self._commlib_anchor is not None:
            run_if(tf.equal(step, self.warmup_steps), self._set_anchor)
        super().apply(grads, variables)
        self._commlib_step.assign_add(1)
        local = step >= self.warmup_steps
        self._commlib_local.assign_add(tf.cast(local, tf.int64))
        run_if(tf.logical_and(local, tf.equal(tf.math.floormod(
            step - self.warmup_steps + 1, self.period), 0)),
            self._stream_meet if self.streaming else self._meet)

    def _warmup_grads(self, grads, variables, in_warmup):
        present = [i for i, g in enumerate(grads) if g is not None]
        dense = [tf.convert_to_tensor(grads[i]) for i in present]
        if tf.executing_eagerly():
            if bool(in_warmup):
                dense = self._commlib_allreduce(dense, [variables[i] for i in present])
        else:
            dense = tf.cond(in_warmup, lambda: self._commlib_allreduce(
                dense, [variables[i] for i in present]), lambda: dense)
        out = list(grads)
        for i, g in zip(present, dense):
            out[i] = g
        return out

    def _set_anchor(self):
        for a, v in zip(self._commlib_anchor, self._commlib_model_vars):
            a.assign(v)

    def _averaged_vars(self) -> list:
        """What a meeting averages: the trainable variables, then the buffers."""
        return self._commlib_model_vars + self._commlib_buffer_vars

    def _meet(self):
        """Averages the model's weights (and buffers) across ranks and takes
        the meeting step with the average."""
        values = [tf.convert_to_tensor(v) for v in self._averaged_vars()]
        if self._commlib_communicate:
            values = _ops.grouped_allreduce_raw(values, Average, name="LocalSGDMeet",
                                                process_set=self.process_set)
        self._meeting_step(values)
        self._commlib_local.assign(0)

    def _meeting_step(self, average):
        """The weights become the average or, with an outer optimizer, its
        step from the anchor (the result is the new anchor); the buffers
        (after the weights in ``average``) become their average."""
        model_vars = self._commlib_model_vars
        for v, a in zip(self._commlib_buffer_vars, average[len(model_vars):]):
            v.assign(a)
        if self.outer_optimizer is None:
            for v, a in zip(model_vars, average):
                v.assign(a)
            return
        anchors = self._commlib_anchor
        pseudo = [tf.convert_to_tensor(a) - avg for a, avg in zip(anchors, average)]
        for v, a in zip(model_vars, anchors):
            v.assign(a)
        self.outer_optimizer.apply(pseudo, model_vars)
        for a, v in zip(anchors, model_vars):
            a.assign(v)

    def _finish_stream(self):
        """Waits for the pending streaming average and takes the meeting step
        with it, keeping this rank's progress since the snapshot."""
        averaged = self._averaged_vars()
        have, average, snapshot = self._commlib_stream.finish_op(averaged)

        def take():
            progress = [tf.convert_to_tensor(v) - s for v, s in zip(averaged, snapshot)]
            self._meeting_step(average)
            for v, d in zip(averaged, progress):
                v.assign_add(d)

        run_if(have, take)

    def _stream_meet(self):
        """A streaming meeting: the previous one's average is applied, the
        averaging of this one's snapshot starts."""
        self._finish_stream()
        self._commlib_stream.start_op(self._averaged_vars())
        self._commlib_local.assign(0)

    def synchronize(self):
        """Applies a pending streaming average, then holds a meeting now if
        steps were taken since the last one (eager: call it after fit(),
        before evaluating or saving)."""
        if self._commlib_stream is not None and self._commlib_stream.pending:
            self._finish_stream()
        if self._commlib_local is not None and int(self._commlib_local) > 0:
            self._meet()

    def commlib_forget(self) -> None:
        """Drops a pending streaming meeting: the weights were replaced
        (KerasState's restore; the round's counters are restored with the
        optimizer's variables)."""
        if self._commlib_stream is not None:
            self._commlib_stream.drop()


@functools.lru_cache(maxsize=None)
def _local_sgd_class(base):
    return type(base.__name__, (_LocalSGDMixin, base),
                {"__module__": base.__module__, "__qualname__": base.__qualname__})


def _check_int(value, what, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")


def _buffers(model) -> list:
    """The model's floating-point non-trainable variables outside frozen
    layers (BatchNormalization's moving statistics)."""
    frozen = set()
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if not layer.trainable:
            frozen.update(id(v) for v in layer.weights)
    return [v for v in model.non_trainable_variables
            if id(v) not in frozen and "float" in str(v.dtype)]


def LocalSGD(optimizer, model, period, outer_optimizer=None, warmup_steps=0, process_set=None,
             streaming=False, average_buffers=True):
    """A copy of the Keras ``optimizer`` that trains locally and meets every
    ``period`` steps (see the module's docstring); pass it to
    ``model.compile`` or call its ``apply`` in a custom loop. ``model``'s
    trainable variables are the ones averaged. Build it on every rank (of
    ``process_set``) alike."""
    from .optimizer_base import DistributedOptimizerMixin, check_backend

    check_backend()
    process_set = check_process_set(process_set, member=False)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"expected a Keras optimizer, got {type(optimizer).__name__}")
    if isinstance(optimizer, (DistributedOptimizerMixin, _LocalSGDMixin)):
        raise ValueError("LocalSGD wraps a plain Keras optimizer: a DistributedOptimizer would "
                         "average every step's gradients")
    if not isinstance(model, keras.Model):
        raise ValueError(f"model must be a keras.Model, got {type(model).__name__}")
    if not model.trainable_variables:
        raise ValueError("the model has no trainable variables (build it first)")
    _check_int(period, "period", 1)
    _check_int(warmup_steps, "warmup_steps", 0)
    if not isinstance(streaming, bool):
        raise ValueError(f"streaming must be True or False, got {streaming!r}")
    if not isinstance(average_buffers, bool):
        raise ValueError(f"average_buffers must be True or False, got {average_buffers!r}")
    buffers = _buffers(model) if average_buffers else []
    if outer_optimizer is not None:
        if not isinstance(outer_optimizer, keras.optimizers.Optimizer):
            raise ValueError(f"outer_optimizer must be a Keras optimizer, got "
                             f"{type(outer_optimizer).__name__}")
        if outer_optimizer is optimizer:
            raise ValueError("outer_optimizer must be a separate optimizer from the inner one")
    if included(process_set) and set_size(process_set) > 1:
        _check_same_everywhere(model, buffers, period, outer_optimizer, warmup_steps,
                               process_set, streaming, average_buffers)
    new = _local_sgd_class(type(optimizer)).from_config(optimizer.get_config())
    new._commlib_local_setup(model.trainable_variables, buffers, period, outer_optimizer,
                             warmup_steps, process_set, streaming)
    object.__setattr__(new, "average_buffers", average_buffers)
    return new


def _check_same_everywhere(model, buffers, period, outer, warmup, process_set, streaming,
                           average_buffers):
    """CollectiveMismatchError on every rank if the options or the model's
    variables (shapes, dtypes) differ across ranks (a meeting on some ranks
    only would otherwise stall)."""
    sig = [("options: period, warmup_steps, outer optimizer, streaming, average_buffers", period,
            warmup, type(outer).__name__ if outer is not None else None, streaming,
            average_buffers)]
    sig += [(f"variable {i}", tuple(v.shape), str(v.dtype))
            for i, v in enumerate(model.trainable_variables)]
    sig += [(f"buffer {i}", tuple(v.shape), str(v.dtype)) for i, v in enumerate(buffers)]
    check_same_everywhere(sig, "LocalSGD: the options or the model's variables",
                          name="LocalSGD:signature", process_set=process_set)

"""Local SGD and DiLoCo for Keras (``commlib.tensorflow.keras.LocalSGD``):
commlib.local_sgd's rule as an optimizer wrapper whose schedule runs inside
the compiled train step (tf.cond on a step counter)."""
from __future__ import annotations

import functools

import keras
import tensorflow as tf

from commlib.delayed import present, scatter
from commlib.local_sgd import LocalSGDPlan, LocalSGDRun, MeetingOps, check_wrapped
from commlib.ops import Average
from commlib.process_sets import check_process_set, communicates

from .. import mpi_ops as _ops
from ..delayed_tape import build_outside_cond
from ..gradient_tape import make_allreduce_grads
from ..streaming import StreamingMeetings
from .optimizer_base import own_counter, own_zeros_like, run_after, run_if


class _LocalSGDMixin:
    """Placed in front of the inner optimizer's class."""

    def _commlib_local_setup(self, plan, model_vars, buffer_vars, outer, process_set):
        s = functools.partial(object.__setattr__, self)
        for k in ("period", "warmup_steps", "streaming", "average_buffers"):
            s(k, getattr(plan, k))
        s("outer_optimizer", outer)
        s("process_set", process_set)
        s("_commlib_plan", plan)
        s("_commlib_model_vars", list(model_vars))
        s("_commlib_buffer_vars", list(buffer_vars))
        s("_commlib_stream", StreamingMeetings(process_set) if plan.streaming else None)
        s("_commlib_communicate", communicates(process_set))
        s("_commlib_allreduce", make_allreduce_grads(op=Average, process_set=process_set,
                                                     name="LocalSGDWarmup"))
        s("_commlib_run", None)

    def build(self, variables):
        super().build(variables)
        if getattr(self, "_commlib_run", 1) is not None:
            return
        # The schedule's counters and DiLoCo's anchor are not the optimizer's
        # variables (own_zeros_like): KerasState checkpoints them, with the
        # outer optimizer's (commlib_state_variables).
        outer, model_vars = self.outer_optimizer, self._commlib_model_vars
        ops = MeetingOps(lambda v, a: v.assign(a), lambda v, d: v.assign_add(d),
                         getattr(outer, "apply", None), lambda x, y: tf.convert_to_tensor(x) - y,
                         run_if, average=self._commlib_average, after=run_after)
        object.__setattr__(self, "_commlib_run", LocalSGDRun(
            self._commlib_plan, ops, model_vars, self._commlib_buffer_vars, self._commlib_stream,
            own_counter("commlib_step"), own_counter("commlib_local_steps"),
            own_zeros_like(model_vars, "commlib_anchor") if outer is not None else None))
        if outer is not None:
            outer.build(model_vars)

    def commlib_state_variables(self) -> list:
        """Training state beyond ``variables`` (the inner optimizer's): the
        counters, the anchor and the outer optimizer's variables, for
        KerasState."""
        run = self._commlib_run
        if run is None:
            return []
        extra = [run.step, run.local_steps] + list(run.anchor or [])
        if self.outer_optimizer is not None:
            extra += list(self.outer_optimizer.variables)
        return extra

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        variables = (list(trainable_variables) if trainable_variables is not None
                     else list(self._trainable_variables))
        build_outside_cond(self, variables)
        self._commlib_run.run_step(lambda in_warmup: super(_LocalSGDMixin, self).apply(
            self._warmup_grads(grads, variables, in_warmup), variables))

    def _warmup_grads(self, grads, variables, in_warmup):
        if not self.warmup_steps:
            return grads
        at = present(grads)
        dense = [tf.convert_to_tensor(grads[i]) for i in at]
        dense = tf.cond(in_warmup, lambda: self._commlib_allreduce(
            dense, [variables[i] for i in at]), lambda: dense)
        return scatter(len(grads), at, dense)

    def _commlib_average(self, variables):
        values = [tf.convert_to_tensor(v) for v in variables]
        if not self._commlib_communicate:
            return values
        return _ops.grouped_allreduce_raw(values, Average, name="LocalSGDMeet",
                                          process_set=self.process_set)

    def synchronize(self):
        """Applies a pending streaming average, then holds a meeting now if
        steps were taken since the last one (eager: call it after fit(),
        before evaluating or saving)."""
        if self._commlib_run is not None:
            self._commlib_run.synchronize()

    def commlib_forget(self) -> None:
        """Drops a pending streaming meeting: the weights were replaced
        (KerasState's restore; the round's counters are restored with the
        optimizer's variables)."""
        if self._commlib_run is not None:
            self._commlib_run.forget()


@functools.lru_cache(maxsize=None)
def _local_sgd_class(base):
    return type(base.__name__, (_LocalSGDMixin, base),
                {"__module__": base.__module__, "__qualname__": base.__qualname__})


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
    """A copy of the Keras ``optimizer`` (an instance of a subclass of its
    class) that trains locally and meets every ``period`` steps; pass it to
    ``model.compile`` or call its ``apply`` in a custom loop. Build it on
    every rank (of ``process_set``) alike::

        inner = keras.optimizers.AdamW(1e-3)
        outer = keras.optimizers.SGD(0.7, momentum=0.9, nesterov=True)
        opt = hvd.LocalSGD(inner, model, period=8, outer_optimizer=outer)   # DiLoCo
        model.compile(optimizer=opt, loss="mse")
        model.fit(x, y, ...)
        opt.synchronize()     # a last meeting if steps were taken since the previous one

    The rule (commlib.local_sgd's, as for ``commlib.torch.LocalSGD``): every
    step the wrapped optimizer steps on local gradients; after every
    ``period``-th step (after ``warmup_steps`` synchronous steps) the ranks
    average ``model.trainable_variables``, or with ``outer_optimizer``
    (DiLoCo) every rank restarts from the anchor with gradient
    ``anchor - average`` and steps the outer optimizer.
    ``average_buffers=True`` also averages the non-trainable float variables
    of layers that are not frozen (BatchNormalization's moving statistics).
    ``streaming=True`` overlaps each meeting with the next round (one round
    stale). ``synchronize()`` holds a meeting now. For elastic training,
    ``KerasState`` also keeps its counters, DiLoCo's anchor and the outer
    optimizer's variables."""
    from .optimizer_base import DistributedOptimizerMixin, check_backend

    check_backend()
    process_set = check_process_set(process_set, member=False)
    check_wrapped(optimizer, model, outer_optimizer,
                  (keras.optimizers.Optimizer, "Keras optimizer"), (keras.Model, "keras.Model"),
                  ValueError)
    if isinstance(optimizer, (DistributedOptimizerMixin, _LocalSGDMixin)):
        raise ValueError("LocalSGD wraps a plain Keras optimizer: a DistributedOptimizer would "
                         "average every step's gradients")
    if not model.trainable_variables:
        raise ValueError("the model has no trainable variables (build it first)")
    plan = LocalSGDPlan(period, warmup_steps, streaming, average_buffers, outer_optimizer,
                        optimizer)
    buffers = _buffers(model) if average_buffers else []
    named = [(f"variable {i}", v) for i, v in enumerate(model.trainable_variables)]
    plan.check_same_everywhere(named, enumerate(buffers), "LocalSGD:signature", process_set)
    new = _local_sgd_class(type(optimizer)).from_config(optimizer.get_config())
    new._commlib_local_setup(plan, model.trainable_variables, buffers, outer_optimizer,
                             process_set)
    return new

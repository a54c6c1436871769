"""The Keras ``DistributedOptimizer(..., zero_stage=1|2)``: ZeRO with the
optimizer state sharded across ranks.

    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3), zero_stage=2)
    model.compile(optimizer=opt, loss="mse")   # or opt.apply(grads, vars) in a custom loop
    model.fit(x, y, ...)
    print(hvd.memory_report(model, opt))

When the optimizer is built, the trainable variables are planned into flat
buckets (commlib.sharding: one dtype each, at most ``bucket_elements``
elements, padded to ``size`` equal shards; the padding is never a variable).
Rank i keeps a shard-sized ``tf.Variable`` per bucket and a private copy of
the wrapped optimizer (same class and config) built on those shard
variables, so its slots (Adam's two moments) cover 1/size of the elements.
Each step:

1. the gradients are laid out flat per bucket (a missing gradient counts as
   zeros) and reduce-scattered: each rank receives only its shard's
   average, so with the gather of step 3 a step moves the bytes of one
   allreduce (allreducing the whole buffer and keeping the shard, as stage
   1 once did, moved 1.5 times as many);
2. the shard variables are refreshed from the model's variables (so weights
   set by the user, a broadcast callback or load_weights are respected) and
   the private optimizer steps them with the averaged shard gradients, at
   the outer optimizer's iteration and learning rate;
3. the updated shards are allgathered and written back into every rank's
   model variables; ``iterations`` counts the step.

Memory: in TensorFlow no gradient outlives a step (there is no ``p.grad``
to keep averaged), so stages 1 and 2 do the same: the saving is in the
optimizer state (8 bytes/parameter for fp32 Adam becomes 8/size) and in
the averaged gradient, of which each rank receives 4/size bytes per
parameter. Stage 1 is accepted for symmetry with commlib.torch. The local,
unreduced gradients the tape computes exist in full, transiently.
A shard copy of the parameters (4/size bytes per parameter) is kept.

Works eagerly and inside tf.function (``model.fit``, custom loops whose step
is a tf.function); the optimizer is built eagerly (tf.init_scope) even when
its first ``apply`` is traced. The update must be element-wise (SGD, Adam,
AdamW, RMSprop, Adagrad, Adamax, Nadam, Lion, ...; not Lamb, Adafactor or
Muon, which use whole-tensor norms). Not combined with clipnorm /
global_clipnorm (per-shard norms would differ from per-variable ones), EMA,
gradient_accumulation_steps, backward_passes_per_step, staleness, groups,
local_layers, compression or process sets (yet). The private optimizer's
state is not in ``optimizer.variables`` (so broadcast callbacks do not mix
ranks' shards); checkpoint it with ``save_sharded``/``load_sharded``.
"""
from __future__ import annotations

import functools
import re

import keras
import tensorflow as tf

from commlib.ops import Average, Sum
from commlib.process_sets import set_rank, set_size
from commlib.sharding import check_zero_stage, plan_buckets
from commlib.signature import check_same_everywhere

from .. import mpi_ops as _ops
from ..compression import Compression
from .optimizer_base import DistributedOptimizerMixin

SHARD_PREFIX = "commlib_zero_shard"
_SLOT_NAME = re.compile(SHARD_PREFIX + r"(\d+)_(.+)$")
_NOT_ELEMENTWISE = ("Lamb", "Adafactor", "Muon")


class ZeroOptimizerMixin(DistributedOptimizerMixin):
    """Placed in front of the wrapped optimizer's class (zero_stage 1 or 2)."""

    def commlib_zero_setup(self, base, stage, bucket_elements, op, pre, post):
        """Called once by DistributedOptimizer on the new optimizer: ``base``
        is the wrapped optimizer's class, ``pre``/``post`` the reduction's
        scale factors. Until ``build``, ``zero_buckets`` (one
        commlib.sharding.Bucket per flat bucket), ``zero_shards`` (this
        rank's shard variable per bucket) and ``zero_shard_optimizer`` (the
        wrapped optimizer's class, built on the shards) are None."""
        s = functools.partial(object.__setattr__, self)
        s("zero_stage", stage)
        s("_zero_base", base)
        s("_zero_bucket_elements", bucket_elements)
        s("_zero_op", op)
        s("_zero_scales", (pre, post))
        s("zero_buckets", None)
        s("_zero_vars", None)  # the model variables, in the order of the plan's entries
        s("zero_shards", None)
        s("zero_shard_optimizer", None)

    # ------------------------------------------------------------ set-up

    def build(self, variables):
        # The base class's build only (iterations, variable indices): no
        # full-size slots; the shard optimizer holds the state.
        keras.optimizers.Optimizer.build(self, variables)
        with tf.init_scope():
            self._zero_build(list(variables))

    def _zero_build(self, variables):
        world, pos = set_size(None), set_rank(None)
        names = variable_names(variables)
        entries = [(n, tuple(int(d) for d in v.shape), str(v.dtype), 0)
                   for n, v in zip(names, variables)]
        check_same_everywhere([("zero", self.zero_stage, self._zero_bucket_elements)] + entries,
                              "ZeRO optimizer variables (name, shape, dtype)",
                              name="commlib.keras.zero.signature")
        for (n, _, dtype, _), v in zip(entries, variables):
            if not tf.as_dtype(dtype).is_floating:
                raise TypeError(f"zero_stage: variable {n!r} has dtype {dtype}; only floating "
                                "point variables can be trained with ZeRO")
        buckets = plan_buckets(entries, world, self._zero_bucket_elements)
        object.__setattr__(self, "zero_buckets", buckets)
        object.__setattr__(self, "_zero_vars", variables)
        object.__setattr__(self, "_zero_index", {n: i for i, n in enumerate(names)})
        shards = [keras.Variable(self.zero_local_shard(i, pos), dtype=b.dtype,
                                 name=f"{SHARD_PREFIX}{i}")
                  for i, b in enumerate(buckets)]
        config = self.get_config()
        config["name"] = f"{config.get('name') or 'optimizer'}_zero_shard"
        inner = self._zero_base.from_config(config)
        inner.build(shards)
        object.__setattr__(self, "zero_shards", shards)
        object.__setattr__(self, "zero_shard_optimizer", inner)

    def zero_local_shard(self, i, pos):
        """Rank ``pos``'s shard of bucket ``i``, read from the model's variables."""
        b = self.zero_buckets[i]
        parts, filled = [], 0
        for slot, lo, hi, _at in b.owned_slots(pos):
            v = self._zero_vars[self._zero_index[slot.name]]
            parts.append(tf.reshape(tf.convert_to_tensor(v), [-1])[lo:hi])
            filled += hi - lo
        if filled < b.shard:
            parts.append(tf.zeros([b.shard - filled], dtype=b.dtype))
        return tf.concat(parts, 0) if len(parts) > 1 else parts[0]

    # ------------------------------------------------------------ step

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if not grads:
            return
        if trainable_variables is None:
            if not self.built:
                raise ValueError("When passing `grads` without `variables`, the optimizer must "
                                 "already be built: call optimizer.build(trainable_variables)")
            variables = list(self._trainable_variables)
        else:
            variables = list(trainable_variables)
            if not self.built:
                with keras.name_scope(self.name, caller=self):
                    self.build(variables)
                self.built = True
            self._check_variables_are_known(variables)
        if len(grads) != len(variables):
            raise ValueError(f"{len(grads)} gradients for {len(variables)} variables")
        by_index = {self._get_variable_index(v): g for g, v in zip(grads, variables)}
        with tf.name_scope("commlib_zero"):
            self._zero_step(by_index)

    def _zero_flat(self, i, by_index):
        b = self.zero_buckets[i]
        parts = []
        for s in b.slots:
            g = by_index.get(self._zero_index[s.name])
            if g is None:
                parts.append(tf.zeros([s.numel], dtype=b.dtype))
            else:
                g = tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                parts.append(tf.reshape(tf.cast(g, b.dtype), [-1]))
        if b.padded > b.numel:
            parts.append(tf.zeros([b.padded - b.numel], dtype=b.dtype))
        return tf.concat(parts, 0) if len(parts) > 1 else parts[0]

    def _zero_reduce(self, flats):
        """This rank's shard of each bucket's averaged gradient (both
        stages)."""
        pre, post = self._zero_scales
        out = []
        for f, b in zip(flats, self.zero_buckets):
            rows = _ops.reducescatter_raw(tf.reshape(f, [b.world, b.shard]), self._zero_op,
                                           pre, post)
            out.append(tf.reshape(rows, [b.shard]))
        return out

    def _zero_step(self, by_index):
        pos = set_rank(None)
        shard_grads = self._zero_reduce([self._zero_flat(i, by_index)
                                         for i in range(len(self.zero_buckets))])
        self.zero_reload_shards(pos)
        inner = self.zero_shard_optimizer
        inner._iterations.assign(self._iterations)
        if isinstance(self._learning_rate, keras.Variable):
            inner._learning_rate.assign(self._learning_rate)
        inner.apply(shard_grads, self.zero_shards)
        gathered = _ops.grouped_allgather_raw([tf.convert_to_tensor(s)
                                                for s in self.zero_shards])
        for b, full in zip(self.zero_buckets, gathered):
            for s in b.slots:
                v = self._zero_vars[self._zero_index[s.name]]
                v.assign(tf.reshape(full[s.offset:s.offset + s.numel], s.shape))
        self._iterations.assign_add(1)

    # ------------------------------------------------------------ state

    def zero_variables(self) -> dict:
        """{name: model variable} of the variables the plan shards, in plan order."""
        return {n: self._zero_vars[i] for n, i in self._zero_index.items()}

    def zero_reload_shards(self, pos: int) -> None:
        """Copies rank ``pos``'s shard of every bucket from the model's
        variables into ``zero_shards``."""
        for i, s in enumerate(self.zero_shards):
            s.assign(self.zero_local_shard(i, pos))

    def shard_states(self) -> list:
        """This rank's optimizer state: per bucket, {slot key: the private
        optimizer's shard-sized variable} (e.g. Adam's momentum, velocity)."""
        if self.zero_shard_optimizer is None:
            return []
        out = [{} for _ in self.zero_buckets]
        for v in self.zero_shard_optimizer.variables:
            m = _SLOT_NAME.search(v.name)
            if m and int(m.group(1)) < len(out):
                out[int(m.group(1))][m.group(2)] = v
        return out


def variable_names(variables) -> list:
    """A name per variable (its Keras path), made unique by a ``#k`` suffix."""
    out, seen = [], {}
    for v in variables:
        name = str(getattr(v, "path", None) or v.name)
        k = seen.get(name, 0)
        seen[name] = k + 1
        out.append(name if k == 0 else f"{name}#{k}")
    return out


def check_zero_options(optimizer, stage, bucket_elements, *, op, backward_passes_per_step,
                       staleness, groups, local_layers, compression, process_set) -> int:
    """ValueError for what zero_stage does not take; returns the bucket size."""
    bucket_elements = check_zero_stage(stage, bucket_elements)
    if getattr(optimizer, "built", False):
        raise ValueError("zero_stage > 0 must wrap an optimizer that has not been built yet "
                         "(its state would not be sharded); load state with load_sharded")
    names = [n for n in _NOT_ELEMENTWISE if isinstance(optimizer, getattr(keras.optimizers, n,
                                                                           ()))]
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or names:
        raise ValueError(f"zero_stage does not support {type(optimizer).__name__}: its update "
                         "is not element-wise or it wraps another optimizer")
    refused = {"clipnorm": optimizer.clipnorm, "global_clipnorm": optimizer.global_clipnorm,
               "use_ema": optimizer.use_ema,
               "gradient_accumulation_steps": optimizer.gradient_accumulation_steps,
               "exclude_from_weight_decay": getattr(optimizer, "_exclude_from_weight_decay",
                                                    None) or
               getattr(optimizer, "_exclude_from_weight_decay_pattern", None),
               "backward_passes_per_step > 1": int(backward_passes_per_step) > 1,
               "staleness": staleness != 0, "groups": groups is not None,
               "local_layers": bool(local_layers),
               "compression": compression is not Compression.none,
               "process_set": getattr(process_set, "process_set_id", 0) != 0,
               f"op {op}": op not in (Average, Sum)}
    bad = [k for k, v in refused.items() if v]
    if bad:
        raise ValueError(f"zero_stage > 0 cannot be combined with {', '.join(bad)}")
    return bucket_elements

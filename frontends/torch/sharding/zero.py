"""ZeRO stages 1 and 2: DistributedOptimizer with sharded optimizer state.

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   zero_stage=2)
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # stage 2: gradients reduce-scattered as they appear
        opt.step()                          # this rank's shard steps, then parameters are allgathered

The parameters are moved into flat buckets (one dtype and param group each,
at most ``bucket_elements`` elements; the parameters become views of them)
and every bucket is split element by element into ``size`` equal shards
(padded; the padding is never a parameter). Rank i keeps optimizer state for
shard i only: a shard-sized optimizer of the wrapped class, with the same
hyperparameters (copied from ``param_groups`` at every step, so LR
schedulers work), steps the shards in place bucket by bucket, and each
bucket's updated shards are gathered into every rank's parameters (one
in-place allgather) while the next bucket steps.

- Both stages reduce-scatter a bucket's gradients when they are all final
  (overlapped with backward), read where autograd left them (zero_pieces:
  no packing copy), into a persistent shard-sized gradient: each rank
  receives its shard's averaged gradient. With the parameter gather after
  the step, that moves the bytes of one allreduce.
- Stage 1 keeps full gradients: ``p.grad`` are autograd's. ``step()`` alone
  reduces only the shards, so after it ``p.grad`` holds this rank's own
  (local, not averaged) gradient. An explicit ``synchronize()`` also gathers
  the averaged shards into a flat gradient per bucket (made then, once) whose
  views become ``p.grad`` (one more gather and a copy, paid only then):
  every ``p.grad`` holds the averaged gradient, so
  ``torch.nn.utils.clip_grad_norm_`` works as without ZeRO (then step inside
  ``skip_synchronize()``), and ``p.grad`` still holds it (clipped) after that
  step. From then on the next backward's gradients are copied into the flat
  gradient (``p.grad`` stay its views). Memory: parameters and gradients in
  full, optimizer state / size.
- Stage 2: each rank keeps only its shard's averaged gradient; ``p.grad``
  are dropped at the end of ``step()``, and a step allocates nothing beyond
  the gradients autograd makes. Clip with
  ``optimizer.clip_grad_norm_`` (after ``synchronize()``); ``p.grad`` is
  None after ``synchronize()``.

The update is element-wise per shard, so optimizers whose update of an
element depends only on that element (SGD, Adam, AdamW, RMSprop, Adagrad,
...) give what they give without ZeRO; ones that use whole-tensor norms
(LAMB, Adafactor) or closures re-evaluated in ``step`` (LBFGS) do not.
A parameter with no gradient on any rank takes a zero gradient (its
momentum still moves it), as in other ZeRO implementations; parameters
frozen (``requires_grad=False``) when the optimizer is built are left out.

``opt.state[p]`` shows the state of the parameters (or their slices) this
rank owns, as views of the shard's (see ``state``). ``state_dict()`` is this
rank's shard (loadable at the same size and rank);
``load_state_dict`` also takes an ordinary per-parameter state dict (from
``full_state_dict`` or an optimizer without ZeRO) and keeps this rank's
part. ``commlib.torch.save_sharded``/``load_sharded`` reshard across sizes.
"""
from __future__ import annotations

import inspect
import math
import warnings

import torch

import commlib as _c
from commlib.process_sets import set_rank, set_size
from commlib.sharding import check_zero_stage, plan_buckets

from .. import mpi_ops as _ops
from ..collectives.compression import Compression
from ..collectives.control import refuse_join
from ..collectives.tensor_io import as_array
from ..optim.optimizer import share_state
from .zero_buckets import FlatBucket
from .zero_pieces import reducescatter_grads_async
from .zero_state import (group_hyperparameters, is_elementwise, owned_elements, owned_state,
                         shard_from_params, torch_order)


class ZeroMixin:
    """Placed before DistributedOptimizer's mixin and the wrapped optimizer's
    class (zero_stage 1 or 2); it overrides the gradient exchange, the step
    and the state."""

    # ------------------------------------------------------------ set-up

    def _zero_init(self, base, stage: int, bucket_elements: int):
        refuse_join(self, f"join() does not work with DistributedOptimizer(zero_stage={stage}): every "
                          "rank's shard takes part in every step, so no rank can leave early; give every "
                          "rank the same number of batches (drop_last, or commlib.torch.elastic's sampler)")
        self.zero_stage = stage
        self._bucket_elements = bucket_elements
        self._buckets_started = 0  # buckets whose reduce-scatter has started this step
        world, pos = set_size(self.process_set), set_rank(self.process_set)
        group_of = {p: i for i, g in enumerate(self.param_groups) for p in g["params"]}
        # Buckets in the reverse of the model's order: backward finishes the
        # last layers first, so their buckets are reduced while it goes on.
        managed = [p for p in reversed(list(self._parameter_names)) if p.requires_grad]
        entries = [(self._parameter_names[p], tuple(p.shape), str(p.dtype), group_of[p])
                   for p in managed]
        plans = plan_buckets(entries, world, bucket_elements)
        by_name = {self._parameter_names[p]: p for p in managed}
        self._buckets = [FlatBucket(plan, [by_name[s.name] for s in plan.slots], pos)
                         for plan in plans]
        self._bucket_of = {p: b for b in self._buckets for p in b.params}
        self._unmanaged = [p for p in self._params if p not in self._bucket_of]
        inner_groups = []
        for i, g in enumerate(self.param_groups):
            hyper = {k: v for k, v in g.items() if k != "params"}
            inner_groups.append(dict(hyper, params=[b.shard for b in self._buckets
                                                    if b.plan.group == i]))
        try:
            self._inner = base(inner_groups, **_init_keywords(base, self.defaults))
        except TypeError as e:
            raise TypeError(f"zero_stage needs {base.__name__}(params, **defaults) to build the "
                            f"shard optimizer: {e}") from e
        if not self._reduces:  # a set of one rank: no check, but the same hooks
            self._register_hooks(self._params)

    def _signature(self) -> list:
        return super()._signature() + [("zero", self.zero_stage, self._bucket_elements)]

    # ------------------------------------------------------------ gradients

    def _hook(self, p):
        b = self._bucket_of.get(p)
        if not self._final_pass(p) or b is None:
            return
        if b.grad_flat is not None:
            b.adopt_grad(p)
        b.ready += 1
        # Buckets start in index order on every rank (a bucket ready early
        # waits for the ones before it), so all ranks submit them alike.
        buckets = self._buckets
        while self._buckets_started < len(buckets) and \
                buckets[self._buckets_started].ready == len(buckets[self._buckets_started].params):
            self._start_bucket(buckets[self._buckets_started])
            self._buckets_started += 1

    def _start_bucket(self, b: FlatBucket):
        b.handle = reducescatter_grads_async(b.plan, b.grads(), b.grad_shard,
                                             f"{self._prefix}zero{self._buckets.index(b)}",
                                             self.op, self.process_set, self._scales)

    def _reduce_gradients(self):
        """Finishes every bucket's reduce-scatter (starting those whose
        gradients were not all final: parameters unused on this rank), so
        that each shard's ``grad`` is its averaged gradient."""
        first_error = None
        try:
            for b in self._buckets[self._buckets_started:]:
                self._start_bucket(b)
            for b in self._buckets:
                try:
                    b.shard.grad = _ops.synchronize(b.handle)
                except Exception as e:  # noqa: BLE001 - wait for all, raise the first
                    first_error = first_error or e
        finally:
            for b in self._buckets:
                b.handle, b.ready = None, 0
            self._buckets_started = 0
            self._reset()
        if first_error is not None:
            raise first_error
        for p in self._unmanaged:
            if p.grad is not None:
                raise ValueError(
                    f"parameter {self._parameter_names[p]!r} was frozen (requires_grad=False) "
                    "when the ZeRO optimizer was built, so it is not sharded, but it has a "
                    "gradient now; build the optimizer after unfreezing it")

    def synchronize(self):
        """Finishes the gradient reduction. Stage 2: each rank holds its
        shard's averaged gradient (``p.grad`` is None). Stage 1: the averaged
        shards are also gathered into the flat gradient, so that every
        ``p.grad`` holds the averaged gradient (for
        ``torch.nn.utils.clip_grad_norm_`` or reading it); this costs one
        more gather of the gradients, which ``step()`` alone does not pay."""
        self._reduce_gradients()
        if self.zero_stage == 2:
            self._drop_grads()
        if self.zero_stage == 1:
            for b in self._buckets:
                b.keep_flat_grad()
                lo, hi = b.plan.owned(b.pos)
                mine = b.grad_flat[lo:hi]
                mine.copy_(b.shard.grad)
                b.shard.grad = mine
            self._wait(self._gather_starts(lambda b: b.grad_flat, "grad"))
        self._synchronized = True

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scales the averaged gradients (after ``synchronize()``) so that
        their norm over all parameters is at most ``max_norm``, as
        ``torch.nn.utils.clip_grad_norm_``; returns the norm before clipping
        (the same on every rank)."""
        if not self._synchronized:
            raise RuntimeError("clip_grad_norm_ needs the averaged gradients: call "
                               "optimizer.synchronize() first")
        grads = [b.shard.grad for b in self._buckets if b.shard.grad is not None]
        norm_type = float(norm_type)
        if math.isinf(norm_type):
            local = max((float(g.abs().max()) for g in grads if g.numel()), default=0.0)
            op = _c.Max
        else:
            local = sum(float(g.double().abs().pow(norm_type).sum()) for g in grads)
            op = _c.Sum
        total = _ops.allreduce(torch.tensor([local], dtype=torch.float64), op=op,
                               name=self._internal("zero.norm"), process_set=self.process_set)
        total = float(total[0]) if math.isinf(norm_type) else float(total[0]) ** (1 / norm_type)
        coef = float(max_norm) / (total + 1e-6)
        if coef < 1.0:
            for b in self._buckets:
                g = b.grad_flat if b.grad_flat is not None else b.shard.grad
                if g is not None:
                    g.mul_(coef)
        return torch.tensor(total)

    # ------------------------------------------------------------ step

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown.")
            self._reduce_gradients()
        self._synchronized = False
        for outer, inner in zip(self.param_groups, self._inner.param_groups):
            for k, v in outer.items():
                if k != "params":
                    inner[k] = v
        try:
            self._step_and_gather()
        finally:
            if self.zero_stage == 2:
                self._drop_grads()
        if self.zero_stage == 1:
            for b in self._buckets:  # the averaged shard, when it is not part of the flat gradient
                if b.shard.grad is not None and not _within(b.shard.grad, b.grad_flat):
                    b.shard.grad = None
        return loss

    def _drop_grads(self):
        """Stage 2 keeps no full gradient after the step: ``p.grad`` are
        dropped at its end (or by ``synchronize()``)."""
        for b in self._buckets:
            b.drop_grads()

    def _step_and_gather(self):
        """Steps the shards bucket by bucket and gathers each bucket's
        updated parameters while the next one steps."""
        inner, groups, handles = self._inner, self._inner.param_groups, []
        try:
            for b in self._buckets:
                group = groups[b.plan.group]
                params = group["params"]
                group["params"], inner.param_groups = [b.shard], [group]
                try:
                    inner.step()
                finally:
                    group["params"], inner.param_groups = params, groups
                handles += self._gather_starts(lambda b_: b_.flat, "param", [b])
        finally:
            self._wait(handles)

    def _gather_starts(self, flat_of, what: str, buckets=None) -> list:
        """Starts gathering every rank's shard of ``flat_of(bucket)`` into
        every rank's copy (of ``buckets``, default all): one in-place
        allgather per bucket, this rank's shard already in its place and the
        others' written straight into the buffer, with no result to copy.
        Returns the handles."""
        me = set_rank(self.process_set)
        handles = []
        for b in self._buckets if buckets is None else buckets:
            i = self._buckets.index(b)
            whole = as_array(flat_of(b)).reshape(b.plan.world, b.plan.shard)
            handles.append(_c.allgather_async(whole[me:me + 1], name=f"{self._prefix}zero{i}.{what}",
                                              process_set=self.process_set, out=whole))
        return handles

    @staticmethod
    def _wait(handles):
        first_error = None
        for h in handles:
            try:
                _ops.synchronize(h)
            except Exception as e:  # noqa: BLE001 - wait for all, raise the first
                first_error = first_error or e
        if first_error is not None:
            raise first_error

    def zero_grad(self, set_to_none: bool = True):
        if any(b.handle is not None or b.ready for b in self._buckets) or any(
                d != self.backward_passes_per_step for d in self._delay.values()):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        for b in self._buckets:
            b.zero_grad(set_to_none)

    def add_param_group(self, param_group):
        raise NotImplementedError("add_param_group is not supported with zero_stage > 0: the "
                                  "parameters are laid out in shards when the optimizer is "
                                  "built; build a new DistributedOptimizer instead")

    # ------------------------------------------------------------ state

    @property
    def state(self):
        """The state of the parameters this rank owns, as
        ``ZeroRedundancyOptimizer.state`` shows it: ``state[p]`` for every
        parameter with elements in this rank's shards (absent: owned by other
        ranks, or no step yet), views of the shard optimizer's state, so they
        follow its steps and writing into them changes it. A parameter wholly
        in this rank's shard has its element-wise values shaped like it
        (Adam's ``exp_avg``: what one process's Adam holds for it); one split
        across ranks has them 1-D, over the elements ``owned_elements(p)``
        of ``p.reshape(-1)`` (that slice of one process's values). Other
        values (Adam's ``step``) are the shard's. Built at each access."""
        return owned_state(self._buckets, self._inner.state)

    def owned_elements(self, p) -> tuple | None:
        """(lo, hi): the elements of ``p.reshape(-1)`` whose state this rank
        holds (``state[p]``); None for a parameter it holds none of."""
        b = self._bucket_of.get(p)
        return None if b is None else owned_elements(b, p)

    @property
    def zero_buckets(self) -> list:
        """This rank's flat buckets (zero_buckets.FlatBucket), in plan order:
        each with its plan (commlib.sharding.Bucket), parameters, flat
        buffer and this rank's shard of it."""
        return self._buckets

    def shard_states(self) -> list:
        """This rank's optimizer state, one dict per bucket (empty before
        the first step)."""
        return [self._inner.state.get(b.shard, {}) for b in self._buckets]

    def state_dict(self):
        """This rank's shard: loadable by the same rank at the same size
        (``full_state_dict``/``save_sharded`` for other sizes)."""
        return {"zero": self._layout_info(),
                "shard_state": [{k: v for k, v in st.items()} for st in self.shard_states()],
                "param_groups": group_hyperparameters(self)}

    def _layout_info(self) -> dict:
        return {"stage": self.zero_stage, "world": set_size(self.process_set),
                "rank": set_rank(self.process_set),
                "buckets": [b.plan.to_dict() for b in self._buckets]}

    def load_state_dict(self, state_dict):
        """Loads ``state_dict()`` of the same rank and size (of any rank if
        it has no state yet: broadcast_optimizer_state right after building
        the optimizer copies the hyperparameters), or an ordinary
        per-parameter torch optimizer state dict (this rank keeps its part)."""
        self._reset()
        self._synchronized = False
        self._should_synchronize = True
        if "zero" in state_dict:
            info = self._layout_info()
            saved = state_dict["zero"]
            fresh = not any(state_dict["shard_state"])  # e.g. broadcast_optimizer_state
            keys = ("world", "buckets") if fresh else ("world", "rank", "buckets")
            if {k: saved.get(k) for k in keys} != {k: info[k] for k in keys}:
                raise ValueError(
                    f"this ZeRO state dict was saved by rank {saved.get('rank')} of "
                    f"{saved.get('world')} with another layout; use commlib.torch.save_sharded/"
                    "load_sharded or full_state_dict to move state across sizes or models")
            shard_states = state_dict["shard_state"]
        else:
            shard_states = self._shards_from_torch(state_dict)
        self.load_shards(shard_states, state_dict["param_groups"])

    def _shards_from_torch(self, state_dict) -> list:
        order = torch_order(self, self._parameter_names)
        if len(state_dict["param_groups"]) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        saved = state_dict["state"]
        by_name = {name: saved[i] for i, _, name in order if i in saved and name is not None}
        return [shard_from_params(b.plan, b.pos, by_name, b.flat.dtype) or {}
                for b in self._buckets]

    def load_shards(self, shard_states, hyper_groups):
        """Sets this rank's optimizer state, one dict per bucket (as
        ``shard_states()`` returns them), and the param groups'
        hyperparameters (``hyper_groups``: one dict per group)."""
        if len(shard_states) != len(self._buckets):
            raise ValueError(f"{len(shard_states)} bucket states for {len(self._buckets)} buckets")
        for outer, hyper in zip(self.param_groups, hyper_groups):
            outer.update({k: v for k, v in hyper.items() if k != "params"})
        self._inner.state.clear()
        for b, st in zip(self._buckets, shard_states):
            if st:
                self._inner.state[b.shard] = {
                    k: (v.to(b.flat.dtype) if is_elementwise(v, b.plan.shard)
                        and v.is_floating_point() else v).clone()
                    if torch.is_tensor(v) else v for k, v in st.items()}


ZeroMixin.step.hooked = True


def _within(t: torch.Tensor, base) -> bool:
    """Whether ``t`` shares ``base``'s storage."""
    return base is not None and t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def check_arguments(stage, bucket_elements, compression, groups) -> int:
    """ValueError for arguments zero_stage does not take; returns the bucket size."""
    bucket_elements = check_zero_stage(stage, bucket_elements)
    if compression is not Compression.none:
        raise ValueError("zero_stage > 0 does not support gradient compression yet")
    if groups is not None:
        raise ValueError("zero_stage > 0 groups gradients in its own buckets (bucket_elements); "
                         "groups/num_groups are not supported with it")
    return bucket_elements


def _init_keywords(base, defaults: dict) -> dict:
    """The optimizer's defaults that ``base.__init__`` takes by name: a
    class may keep defaults its constructor does not take (torch's AdamW:
    ``decoupled_weight_decay``, which its Adam base takes and AdamW sets)."""
    try:
        params = inspect.signature(base.__init__).parameters
    except (TypeError, ValueError):
        return defaults
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return defaults
    return {k: v for k, v in defaults.items() if k in params}


def _has_stepped(optimizer) -> bool:
    """Whether ``optimizer`` holds state from a step: any state, but the
    initial state some optimizers make in their constructor (Adagrad's
    accumulators at ``step`` 0)."""
    for st in optimizer.state.values():
        if not st:
            continue
        step = st.get("step") if isinstance(st, dict) else None
        if step is None or float(step) != 0:
            return True
    return False


def make_zero(cls, base, optimizer, stage: int, bucket_elements: int, dist_args: tuple):
    """The ZeRO DistributedOptimizer: ``cls`` is the generated class
    (ZeroMixin first, the wrapped optimizer's class ``base`` last)."""
    if _has_stepped(optimizer):
        raise ValueError("zero_stage > 0 must wrap an optimizer that has not stepped yet (its "
                         "state would not be sharded); load state afterwards with "
                         "load_state_dict or commlib.torch.load_sharded")
    optimizer.state.clear()  # (a constructor's initial state: the shard optimizer makes its own)
    # (zero_stage and the bucket size are part of the signature _dist_init checks)
    dist = share_state(cls, optimizer, dist_args, zero_stage=stage, _bucket_elements=bucket_elements)
    dist._zero_init(base, stage, bucket_elements)
    return dist

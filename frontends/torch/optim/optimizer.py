"""DistributedOptimizer: averages gradients across ranks while backward runs.

    import commlib.torch as hvd
    hvd.init()
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # allreduces start as gradients appear
        opt.step()                          # waits for them, then updates

How it works: a post-accumulate-grad hook on every parameter starts that
parameter's in-place ``allreduce_async_`` as soon as its gradient is final
for this step (after ``backward_passes_per_step`` backward passes), so
communication overlaps the rest of backward. ``step()`` (or
``synchronize()``) waits for them.

Parameters that got no gradient on this rank (unused in this forward) cannot
deadlock the others: at ``synchronize()`` every rank contributes, in one small
allreduce, a flag per parameter telling whether it has a gradient. A
parameter with a gradient on some rank is allreduced everywhere (ranks without
one contribute zeros); a parameter with a gradient on no rank keeps
``grad = None`` on every rank and the wrapped optimizer skips it -- exactly as
single-process training on the combined batch would. (Horovod instead gives
such parameters zero gradients, which optimizers with weight decay or momentum
then apply.)

With ``process_set=ps`` (as in Horovod) gradients are averaged over the
set's members only; every rank may build the optimizer, and on ranks outside
the set it is the plain wrapped optimizer (no hooks, no communication: their
gradients stay local).

The wrapper is an instance of a class created on the fly that subclasses the
wrapped optimizer's class, so ``isinstance(opt, torch.optim.SGD)``,
``state_dict()``/``load_state_dict()``, LR schedulers and param_groups work
unchanged; it shares param_groups and state with the optimizer it wraps.
"""
from __future__ import annotations

import collections
import hashlib
import itertools
import warnings
from contextlib import contextmanager

import numpy as np
import torch

import commlib as _c
from commlib import CollectiveMismatchError
from commlib.checks import positive_count
from commlib.grouping import group_indices
from commlib.objects import allgather_object
from commlib.process_sets import included, set_size
from commlib.reduce_args import predivide_scales, resolve_op

from .. import mpi_ops as _ops
from . import sparse_as_dense as _sad
from ..mpi_ops import Average, Sum

# Names of the i-th DistributedOptimizer of a process set agree across the
# set's members (counted per set, so optimizers on other sets do not shift them).
_instances = collections.defaultdict(itertools.count)


def share_state(cls, optimizer, dist_args: tuple, **attributes):
    """An instance of ``cls`` (a class with DistributedOptimizerBase before
    the wrapped optimizer's class) sharing ``optimizer``'s param_groups,
    state, defaults and hooks, given ``attributes`` (what its signature
    needs), then set up by ``dist_args`` (DistributedOptimizer's named
    parameters, compression, backward passes, op, predivide factor, groups,
    sparse_as_dense, process set)."""
    dist = cls.__new__(cls)
    dist.__dict__.update(optimizer.__dict__)
    dist.__dict__.update(attributes)
    dist._dist_init(*dist_args)
    return dist


class DistributedOptimizerBase:
    """Mixin placed before the wrapped optimizer's class."""

    # ------------------------------------------------------------ set-up

    def _dist_init(self, named_parameters, compression, backward_passes_per_step, op,
                   gradient_predivide_factor, groups, sparse_as_dense, process_set):
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"noname.{i}", p) for i, p in enumerate(all_params)]
        if any(not isinstance(p, tuple) or len(p) != 2 for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters().")
        counts = collections.Counter(n for n, _ in named_parameters)
        dups = sorted(n for n, c in counts.items() if c > 1)
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. "
                             f"Found duplicates: {', '.join(dups)}")
        named_ids = {id(p) for _, p in named_parameters}
        unnamed = [p for p in all_params if id(p) not in named_ids]
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model parameters "
                             "were not named: shapes "
                             f"{', '.join(str(tuple(p.shape)) for p in unnamed)}")
        backward_passes_per_step = positive_count(backward_passes_per_step, "backward_passes_per_step")
        op = resolve_op(op)
        # (prescale, postscale) of every gradient allreduce
        self._scales = predivide_scales(op, gradient_predivide_factor)

        in_opt = {id(p) for p in all_params}
        # Names of the parameters this optimizer updates (shared parameters
        # named twice by named_parameters keep their first name).
        self._parameter_names = {}
        for n, p in named_parameters:
            if id(p) in in_opt and p not in self._parameter_names:
                self._parameter_names[p] = n
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        # Only members of a set of more than one rank communicate.
        self._reduces = included(process_set) and set_size(process_set) > 1
        # The parameters to reduce, in one order on every rank (by name). Frozen
        # ones (requires_grad=False) are included: they get no hook, but if
        # they are unfrozen later their gradients are still reduced (at
        # synchronize(), without overlap).
        self._params = sorted(self._parameter_names, key=lambda p: self._parameter_names[p])
        for p in self._params:
            if p.requires_grad:
                _ops.check_tensor(p, f"DistributedOptimizer (parameter "
                                      f"{self._parameter_names[p]!r})")
        self._groups = self._make_groups(groups)
        # Collective names: the i-th DistributedOptimizer of every rank uses
        # the same prefix (counted after the local checks above, which raise
        # on every rank alike or not at all).
        instance = next(_instances[process_set.process_set_id])
        self._prefix = "grad." if instance == 0 else f"grad{instance}."

        # param or group -> (handle, [(param, buffer, compression ctx)]), or
        # param -> (finisher, None) for a sparse gradient
        self._handles = {}
        self._started = set()  # params whose group allreduce has started
        self._ready = set()  # grads final for this step, not yet sent (group not complete)
        self._densified = {}  # param -> (sparse_dim, touched indices): sparse grads sent dense
        self._delay = {p: backward_passes_per_step for p in self._params}
        self._synchronized = False
        self._should_synchronize = True
        self._hook_handles = []
        if self._reduces:
            self._check_same_everywhere()
            self._register_hooks(self._params)

    @property
    def parameter_names(self) -> dict:
        """{parameter: its name} (from named_parameters, else ``noname.<i>``),
        for every parameter this optimizer averages."""
        return dict(self._parameter_names)

    @property
    def name_prefix(self) -> str:
        """The prefix of this optimizer's collective names (``grad.`` for
        the first DistributedOptimizer of a process set, ``grad<i>.`` after)."""
        return self._prefix

    def _internal(self, what: str) -> str:
        """Names of the optimizer's own collectives ("grad:has_grad"), apart
        from the gradients' ("grad.<parameter name>")."""
        return f"{self._prefix[:-1]}:{what}"

    def _register_hooks(self, params):
        for p in params:
            if p.requires_grad:
                self._hook_handles.append(p.register_post_accumulate_grad_hook(self._hook))

    def _make_groups(self, groups):
        """param -> tuple of the params whose allreduces start together
        (``groups`` as resolved by commlib.grouping.resolve_groups; None: every
        parameter on its own, as soon as its gradient is ready)."""
        self._group_names = {}
        if groups is None:
            return {}
        if not isinstance(groups, int):
            seen = set()
            for p in itertools.chain.from_iterable(groups):
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))
        out = {}
        params = self._params  # sorted by name: groups list their members in that order
        for indices in group_indices(range(len(params)), groups,
                                         key_of=lambda i: id(params[i]), group_keys=id):
            if len(indices) > 1:
                group = tuple(params[i] for i in indices)
                self._group_names[group] = f"group.{len(self._group_names)}"
                for p in group:
                    out[p] = group
        return out

    def _signature(self) -> list:
        sig = [(self._parameter_names[p], tuple(p.shape), str(p.dtype)) for p in self._params]
        groups = sorted({tuple(self._parameter_names[q] for q in g)
                         for g in self._groups.values()})
        return [("options", self.backward_passes_per_step, int(self.op),
                 float(self.gradient_predivide_factor),
                 getattr(self._compression, "__name__", type(self._compression).__name__),
                 bool(self.sparse_as_dense), self._prefix, tuple(groups))] + sig

    def _check_same_everywhere(self):
        """Raises CollectiveMismatchError on every rank (of the process set)
        if the parameters (names, shapes, dtypes) or options differ across
        ranks."""
        sig = self._signature()
        digest = hashlib.sha256(repr(sig).encode()).digest()[:8]
        mine = np.frombuffer(digest, dtype=np.int64).copy()
        every = _c.allgather(mine, name=self._internal("signature"), process_set=self.process_set)
        if np.all(every == every[0]):
            return
        sigs = allgather_object(sig, name=self._internal("signature.detail"),
                                process_set=self.process_set)
        raise CollectiveMismatchError(
            "DistributedOptimizer: the parameters or options differ across ranks. "
            + _describe_difference(sigs))

    # ------------------------------------------------------------ hooks

    def _final_pass(self, p) -> bool:
        """Counts a backward pass for p: True when its gradient is final."""
        if self._delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call "
                "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
        self._delay[p] -= 1
        return self._delay[p] == 0

    def _hook(self, p):
        if not self._final_pass(p):
            return
        if p.grad.is_sparse:
            if not self.sparse_as_dense:
                return  # sparse gradients are gathered at synchronize()
            self._densify(p)
        group = self._groups.get(p)
        if group is None:
            self._start(p)
            return
        self._ready.add(p)
        if all(q in self._ready for q in group):
            self._ready.difference_update(group)
            self._start_group(group, group)

    def _buffer(self, p):
        """The tensor to reduce in place for p's (dense) gradient, and the
        compression context."""
        compressed, cctx = self._compression.compress(p.grad)
        return (compressed if compressed.is_contiguous() else compressed.contiguous()), cctx

    def _start(self, p):
        """Starts the in-place allreduce of p's (dense) gradient."""
        buf, cctx = self._buffer(p)
        pre, post = self._scales
        handle = _ops.allreduce_async_(buf, name=self._prefix + self._parameter_names[p],
                                       op=self.op, prescale_factor=pre, postscale_factor=post,
                                       process_set=self.process_set)
        self._handles[p] = (handle, [(p, buf, cctx)])

    def _start_group(self, group, members):
        """Starts one grouped allreduce (negotiated and fused together) of the
        gradients of ``members`` (a subset of ``group``, the same on every
        rank)."""
        bufs = [self._buffer(q) for q in members]
        pre, post = self._scales
        handle = _ops.grouped_allreduce_async_([b for b, _ in bufs],
                                               name=self._internal(self._group_names[group]),
                                               op=self.op, prescale_factor=pre,
                                               postscale_factor=post,
                                               process_set=self.process_set)
        self._handles[group] = (handle, [(q, b, c) for q, (b, c) in zip(members, bufs)])
        for q in members:
            self._started.add(q)

    def _densify(self, p):
        """sparse_as_dense: p's sparse gradient becomes dense (reduced as
        such); the positions it touched are kept to make it sparse again."""
        self._densified[p] = _sad.touched(p.grad)
        p.grad = p.grad.to_dense()

    def _start_sparse(self, p):
        """Starts gathering p's sparse gradient (indices and values) from all
        ranks; a rank without a gradient contributes an empty one."""
        grad = p.grad
        if grad is None:
            grad = torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64),
                                           torch.zeros((0,) + tuple(p.shape[1:]), dtype=p.dtype),
                                           tuple(p.shape))
        pre, post = self._scales
        if pre * post != 1.0:
            grad = grad * (pre * post)
        op = Average if self.op == Average else Sum
        handle = _ops.sparse_allreduce_async(grad, self._prefix + self._parameter_names[p], op,
                                             process_set=self.process_set)
        self._handles[p] = (handle, None)

    # ------------------------------------------------------------ synchronize

    def synchronize(self):
        """Waits for every parameter's allreduce, starting those that have not
        started (parameters unused on this rank, incomplete groups, sparse
        gradients), and writes the reduced gradients into ``p.grad``. On a
        rank outside the process set it does nothing."""
        if not self._reduces or not self._params:
            self._synchronized = True
            return
        try:
            # Two flags per parameter: has a dense gradient; the sparse
            # dimensions of its sparse gradient (0: none), sent dense or not.
            n = len(self._params)
            flags = np.zeros(2 * n, dtype=np.int32)
            for i, p in enumerate(self._params):
                if p in self._densified:
                    flags[n + i] = self._densified[p][0]
                elif p in self._handles or p in self._started:
                    flags[i] = 1
                elif p.grad is not None:
                    if p.grad.is_sparse:
                        flags[n + i] = p.grad.sparse_dim()
                    else:
                        flags[i] = 1
            everywhere = _c.allreduce(flags, op=_c.Max, name=self._internal("has_grad"),
                                      process_set=self.process_set)
            dense_now, groups_now = [], {}
            for i, p in enumerate(self._params):
                if p in self._handles or p in self._started:
                    continue
                dense, sparse = everywhere[i], everywhere[n + i]
                if dense or (sparse and self.sparse_as_dense):
                    if sparse and not self.sparse_as_dense:
                        warnings.warn(f"gradient of {self._parameter_names[p]!r} is sparse on "
                                      "some ranks and dense on others; reducing it as dense")
                    if p.grad is None:
                        p.grad = torch.zeros_like(p, memory_format=torch.preserve_format)
                    elif p.grad.is_sparse:
                        self._densify(p)
                    group = self._groups.get(p)
                    if group is None:
                        dense_now.append(p)
                    else:  # members with a gradient somewhere: the same set on every rank
                        groups_now.setdefault(group, []).append(p)
                elif sparse:
                    self._start_sparse(p)
            for p in dense_now:
                self._start(p)
            for group, members in groups_now.items():
                self._start_group(group, members)
            resparse = self._touched_union(everywhere)
            self._wait_all()
            for p, (dim, mask) in resparse.items():
                p.grad = _sad.to_sparse(p.grad, dim, mask)
        finally:
            self._reset()
        self._synchronized = True

    def _touched_union(self, everywhere) -> dict:
        """sparse_as_dense: param -> (sparse_dim, union over ranks of the
        touched positions) for every parameter whose gradient was sparse on
        some rank and dense on none (one allreduce of all masks)."""
        n = len(self._params)
        dims = {p: int(everywhere[n + i]) for i, p in enumerate(self._params)
                if self.sparse_as_dense and everywhere[n + i] and not everywhere[i]}
        if not dims:
            return {}
        masks = [_sad.mask_of(p.shape, d, self._densified.get(p)) for p, d in dims.items()]
        union = _c.allreduce(np.concatenate(masks), op=_c.Max,
                             name=self._internal("sparse_touched"), process_set=self.process_set)
        out, at = {}, 0
        for (p, d), m in zip(dims.items(), masks):
            out[p] = (d, union[at:at + m.size])
            at += m.size
        return out

    def _wait_all(self):
        first_error = None
        for key, (handle, parts) in list(self._handles.items()):
            try:
                if parts is None:  # sparse: the finisher returns the new gradient
                    key.grad = handle()
                    continue
                _ops.synchronize(handle)
                for p, buf, cctx in parts:
                    if buf is not p.grad:
                        p.grad.copy_(self._compression.decompress(buf, cctx))
            except Exception as e:  # noqa: BLE001 - wait for all, raise the first
                first_error = first_error or e
        if first_error is not None:
            raise first_error

    def _reset(self):
        self._handles.clear()
        self._ready.clear()
        self._started.clear()
        self._densified.clear()
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step

    @contextmanager
    def skip_synchronize(self):
        """Makes ``step()`` skip synchronization, after an explicit
        ``synchronize()`` -- for gradient clipping::

            loss.backward()
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    # ------------------------------------------------------------ optimizer API

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True):
        if self._handles or self._ready or any(d != self.backward_passes_per_step
                                               for d in self._delay.values()):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super().zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict):
        self._handles.clear()
        self._reset()
        self._synchronized = False
        self._should_synchronize = True
        return super().load_state_dict(state_dict)

    def add_param_group(self, param_group):
        """Adds a param group (e.g. layers unfrozen for fine-tuning) on every
        rank: its parameters are reduced like the others (named
        ``param_group<i>.<j>``). Collective: every rank must add the same
        group, as the parameters are checked again across ranks."""
        if self._handles or self._ready:
            raise AssertionError("add_param_group() called with allreduces in flight; call "
                                 "step() or synchronize() first")
        super().add_param_group(param_group)
        index = len(self.param_groups) - 1
        new = [p for p in self.param_groups[-1]["params"] if p not in self._parameter_names]
        for j, p in enumerate(new):
            self._parameter_names[p] = f"param_group{index}.{j}"
            if p.requires_grad:
                _ops.check_tensor(p, f"DistributedOptimizer (parameter "
                                      f"{self._parameter_names[p]!r})")
            self._delay[p] = self.backward_passes_per_step
        self._params = sorted(self._parameter_names, key=lambda p: self._parameter_names[p])
        if self._reduces:
            self._check_same_everywhere()
            self._register_hooks(new)

    def set_backward_passes_per_step(self, passes):
        passes = positive_count(passes, "backward_passes_per_step")
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes


# The hooked step of torch.optim.Optimizer runs the optimizer's step hooks;
# the wrapped class's step (called through super()) already does that, so
# keep torch from wrapping this one too.
DistributedOptimizerBase.step.hooked = True


def _describe_difference(sigs: list) -> str:
    """Which entries differ across ranks, for the error message."""
    def table(sig):
        return {"options" if e[0] == "options" else e[0]: e[1:] for e in sig}

    tables = [table(s) for s in sigs]
    keys = sorted(set().union(*tables), key=lambda k: (k != "options", k))
    parts = []
    for k in keys:
        values = [t.get(k) for t in tables]
        if all(v == values[0] for v in values):
            continue
        by_value = {}
        for r, v in enumerate(values):
            by_value.setdefault(repr(v) if v is not None else "missing", []).append(r)
        what = ("options (backward_passes_per_step, op, gradient_predivide_factor, compression, "
                "sparse_as_dense, name prefix, groups)" if k == "options"
                else "ZeRO options (zero_stage, bucket_elements)" if k == "zero"
                else f"parameter {k!r} (shape, dtype)")
        detail = "; ".join(f"ranks {rs}: {v}" for v, rs in by_value.items())
        parts.append(f"{what}: {detail}")
        if len(parts) >= 5:
            parts.append("...")
            break
    return " | ".join(parts)

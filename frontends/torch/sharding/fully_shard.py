"""ZeRO stage 3: ``fully_shard`` shards a module's parameters across ranks.

    for block in model.blocks:
        hvd.fully_shard(block)
    hvd.fully_shard(model)                      # the root takes the remaining parameters (if any)
    opt = torch.optim.Adam(model.parameters())  # a plain optimizer: it steps the shards
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()         # gradients arrive averaged, in shards
        opt.step()
    with hvd.full_parameters(model):            # the whole parameters, to read or change
        print(model.blocks[0].weight)

Each ``fully_shard`` call takes the parameters of ``module`` that no earlier
call took, lays them end to end (one dtype per call), pads them to
``size * shard`` elements and keeps only this rank's shard, registered on
``module`` as one parameter (``model.parameters()`` yields the shards). Just
before the module's forward the shards are allgathered and the original
parameter names point at views of the whole; after it the whole is freed
(``reshard_after_forward=True``) and gathered again in backward, when
autograd needs the saved parameters. The parameters' gradients are
reduce-scattered (averaged over the set) into the shard's ``grad``, read
where they lie (zero_pieces), so no whole-sized gradient is built.

Outside forward and backward the original parameters do not exist: reading
one raises AttributeError naming ``full_parameters``, never an empty tensor.
Prefetching: a module's forward starts gathering the parameters of the
module that ran next in the previous forward, and its backward those of the
one that ran before it, so each gather overlaps a neighbour's computation
(``prefetch=False`` turns it off). Checkpoints: ``save_sharded`` /
``load_sharded`` at any world size, and ``full_state_dict``
(fully_shard_checkpoint).
"""
from __future__ import annotations

import itertools
from contextlib import contextmanager

import torch

from commlib.process_sets import check_process_set, set_rank, set_size
from commlib.sharding import plan_buckets

from .. import mpi_ops as _ops
from .zero_pieces import reducescatter_grads_async

_count = itertools.count()
_live: dict = {}  # storage address of a gathered whole -> its _Group (for saved tensors)


class _Schedule:
    """The order in which the groups' forwards ran, for prefetching. A pass
    starts with the outermost forward; a gather prefetched in one pass is
    used only in that pass (a later one waits for it and gathers afresh: the
    optimizer may have stepped the shard in between)."""

    def __init__(self):
        self.depth = 0  # group forwards running
        self.order = []  # this pass's groups, in the order their forwards started
        self.last = []  # the previous pass's
        self.done = []  # this pass's groups, in the order their forwards ended
        self.pass_id = 0

    def enter(self, group):
        if self.depth == 0:
            self.new_pass()
        self.depth += 1
        self.order.append(group)

    def new_pass(self):
        self.pass_id += 1
        if self.order:
            self.last, self.order, self.done = self.order, [], []

    @staticmethod
    def after(order, group, wanted=lambda g: True):
        """The first group after ``group`` in ``order`` that is ``wanted``."""
        for i, g in enumerate(order):
            if g is group:
                return next((h for h in order[i + 1:] if wanted(h)), None)
        return None


_schedule = _Schedule()


class _Gather(torch.autograd.Function):
    """shard -> the parameters, views of the gathered whole (allgather);
    backward: their gradients reduce-scattered (Average) into the shard's.
    One output per parameter, so autograd hands over each parameter's
    gradient instead of building whole-sized ones from the views; they are
    reduce-scattered where they lie (zero_pieces)."""

    @staticmethod
    def forward(ctx, shard, group):
        ctx.group = group
        ctx.set_materialize_grads(False)  # None for parameters without a gradient
        group.whole = group.gather()
        return group.views(group.whole)

    @staticmethod
    def backward(ctx, *grads):
        g = ctx.group
        out = torch.empty(g.plan.shard, dtype=g.shard.dtype)
        _ops.synchronize(reducescatter_grads_async(g.plan, list(grads), out, f"{g.name}.grad",
                                                   _ops.Average, g.process_set))
        g.release()  # the whole gathered again for backward is not needed any more
        return out, None


def _pack(t):
    try:
        g = _live.get(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):  # tensors without a plain storage
        return t
    if g is None or not g.reshard_after_forward:
        return t
    return (g, t.storage_offset(), tuple(t.shape), t.stride())


def _unpack(packed):
    if isinstance(packed, torch.Tensor):
        return packed
    g, offset, shape, stride = packed
    return g.regathered().as_strided(shape, stride, offset)


class _Group:
    """The parameters one fully_shard call took, as one padded flat shard."""

    def __init__(self, module, process_set, reshard_after_forward, prefetch):
        self.process_set = process_set
        self.reshard_after_forward = reshard_after_forward
        self.prefetch = prefetch
        self.pending = None  # (handle, pass, shard version) of a prefetched gather
        self.prefetches_used = 0
        self.regathers = False  # gathered again in a backward (so worth prefetching there)
        self.name = f"fsdp{next(_count)}"
        owners = [(m, n, p) for m in _own_modules(module) for n, p in m._parameters.items()
                  if p is not None]
        if not owners:
            raise ValueError("fully_shard: the module has no parameters left to shard")
        seen = {}
        for m, n, p in owners:
            if id(p) in seen:
                raise ValueError(f"fully_shard: parameter {n!r} is shared between modules; "
                                 "shard their common parent instead")
            seen[id(p)] = p
            _ops.check_tensor(p, f"fully_shard (parameter {n!r})")
        dtypes = {p.dtype for _, _, p in owners}
        if len(dtypes) > 1:
            raise TypeError(f"fully_shard: one dtype per call, got {sorted(map(str, dtypes))}; "
                            "shard the submodules of each dtype separately")
        entries = [(f"{i}", tuple(p.shape), str(p.dtype), 0) for i, (_, _, p) in
                   enumerate(owners)]
        self.plan = plan_buckets(entries, set_size(process_set), max_elements=1 << 62)[0]
        flat = torch.cat([p.detach().reshape(-1) for _, _, p in owners]
                         + [torch.zeros(self.plan.padded - self.plan.numel, dtype=p.dtype)])
        a, b = self.plan.owned(set_rank(process_set))
        self.shard = torch.nn.Parameter(flat[a:b].clone(), requires_grad=any(
            p.requires_grad for _, _, p in owners))
        self.places = [(m, n, s) for (m, n, _), s in zip(owners, self.plan.slots)]
        for m, n, _ in owners:
            del m._parameters[n]
            _mark_sharded(m, n)
        self.whole = None  # the gathered parameters, while in use
        self.again = None  # gathered again in backward for the saved tensors

    def start_gather(self) -> None:
        """Prefetch: starts gathering the shards for this pass."""
        if self.pending is not None and not self._fresh(self.pending):
            self.gather()  # (waits for the stale one and drops it)
        if self.pending is None:
            self.pending = (_ops.allgather_async(self.shard.detach(), name=self.name,
                                                 process_set=self.process_set),
                            _schedule.pass_id, self.shard._version)

    def gather(self) -> torch.Tensor:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            whole = _ops.synchronize(pending[0])
            if self._fresh(pending):
                self.prefetches_used += 1
                return whole
        return _ops.synchronize(_ops.allgather_async(self.shard.detach(), name=self.name,
                                                     process_set=self.process_set))

    def _fresh(self, pending) -> bool:
        """Whether a prefetched gather is of this pass and of the shard as it is."""
        return pending[1] == _schedule.pass_id and pending[2] == self.shard._version

    def prefetch_next(self) -> None:
        """Forward: starts gathering the group whose forward followed this
        one's in the previous pass, while this one computes."""
        _prefetch_after(self)

    def prefetch_previous(self) -> None:
        """Backward: starts gathering again the group that needs it and whose
        forward ended before this one's in this pass (its backward comes
        next: a module's backward follows the reverse of the order in which
        forwards ended)."""
        prev = _schedule.after(_schedule.done[::-1], self,
                               lambda g: g.reshard_after_forward and g.regathers)
        if self.prefetch and prev is not None and prev.again is None and prev.whole is None:
            prev.start_gather()

    def views(self, whole) -> tuple:
        """The parameters as views of the gathered ``whole``."""
        return tuple(whole[s.offset:s.offset + s.numel].view(s.shape) for s in self.plan.slots)

    def regathered(self) -> torch.Tensor:
        if self.again is None:
            self.again = self.gather()
            self.regathers = True
            self.prefetch_previous()
        return self.again

    def release(self):
        self.again = None

    def unshard(self, grad: bool):
        self.reshard()
        if grad:
            views = _Gather.apply(self.shard, self)  # (sets self.whole)
        else:
            self.whole = self.gather()
            views = self.views(self.whole)
        _live[self.whole.untyped_storage().data_ptr()] = self
        for (m, n, _), v in zip(self.places, views):
            m.__dict__[n] = v

    def reshard(self):
        if self.whole is not None:
            _live.pop(self.whole.untyped_storage().data_ptr(), None)
        for m, n, _ in self.places:
            m.__dict__.pop(n, None)
        self.whole = None


def _prefetch_after(unit) -> None:
    """Starts gathering the first group (not a _Root) whose forward followed
    ``unit``'s in the previous pass."""
    nxt = _schedule.after(_schedule.last, unit, lambda g: isinstance(g, _Group))
    if unit.prefetch and nxt is not None and nxt.whole is None:
        nxt.start_gather()


class _Root:
    """fully_shard of a module whose parameters all belong to modules
    sharded before (PyTorch's root pattern: ``fully_shard`` on each layer,
    then on the model). It owns no shard and drives the others: its forward
    starts a pass of the schedule (the children's forwards nest in it, so
    prefetching follows their order from one step to the next) and gathers
    the first child's parameters ahead."""

    whole = again = None
    reshard_after_forward = regathers = False

    def __init__(self, prefetch):
        self.prefetch = prefetch

    def prefetch_next(self) -> None:
        _prefetch_after(self)


def _own_modules(module):
    """``module`` and its descendants, except those under an earlier fully_shard."""
    yield module
    for child in module.children():
        if getattr(child, "_commlib_fsdp", None) is None:
            yield from _own_modules(child)


def _mark_sharded(module, name):
    """Reading ``name`` outside forward raises a clear AttributeError."""
    cls = type(module)
    if not getattr(cls, "_commlib_sharded_class", False):
        def __getattr__(self, attr, _base=cls):
            if attr in self.__dict__.get("_commlib_sharded", ()):
                raise AttributeError(
                    f"{attr!r} of {_base.__name__} is sharded by commlib.torch.fully_shard: it "
                    "exists only during forward and backward; read it inside "
                    "`with commlib.torch.full_parameters(model):`")
            return _base.__getattr__(self, attr)

        cls = type(cls.__name__, (cls,), {"__getattr__": __getattr__,
                                          "_commlib_sharded_class": True})
        module.__class__ = cls
    module.__dict__.setdefault("_commlib_sharded", set()).add(name)


def fully_shard(module, process_set=_ops.global_process_set, reshard_after_forward=True,
                prefetch=True):
    """ZeRO stage 3: shards the parameters of ``module`` not taken by an
    earlier call across the ranks of ``process_set``. Returns ``module``.

        for block in model.blocks:
            hvd.fully_shard(block)
        hvd.fully_shard(model)
        opt = torch.optim.Adam(model.parameters())   # a plain optimizer over the shards

    Apply it to submodules first, then to the root. The parameters (one
    dtype per call) become one padded flat shard per rank, registered on
    ``module`` (``model.parameters()`` yields the shards). They are
    allgathered just before the module's forward, freed after it
    (``reshard_after_forward=True``) and gathered again in backward; their
    gradients are reduce-scattered (averaged over the set) into the shard's
    ``grad``. With ``prefetch`` (default), the module's forward starts
    gathering the next module's parameters (in the previous pass's order)
    and its backward the previous module's; a prefetched gather is used only
    if the shard has not changed since. A module whose parameters all belong
    to modules sharded before (an ``nn.Sequential`` of sharded layers) owns
    no shard: it drives theirs (PyTorch's root pattern, see _Root).

    Reading a sharded parameter outside forward and backward raises
    AttributeError; ``with hvd.full_parameters(model):`` gathers them (changes
    are written back). Checkpoints: ``hvd.save_sharded(dir, model, opt)`` /
    ``hvd.load_sharded(dir, model, opt)`` (one file per rank, loadable at any
    world size, and interchangeable with stage 1-2 checkpoints when the
    parameter names match); ``hvd.full_state_dict(model, opt)`` gathers the
    whole parameters under their names. ``hvd.memory_report(model, opt)``
    gives the bytes held per rank. Applying it twice to a module raises
    ValueError."""
    process_set = check_process_set(process_set)
    if (getattr(module, "_commlib_fsdp", None) is not None
            or getattr(module, "_commlib_fsdp_root", None) is not None):
        raise ValueError("fully_shard was already applied to this module")
    if not any(p is not None for m in _own_modules(module) for p in m._parameters.values()) \
            and any(getattr(m, "_commlib_fsdp", None) is not None for m in module.modules()):
        return _drive(module, _Root(bool(prefetch)))
    group = _Group(module, process_set, reshard_after_forward, bool(prefetch))
    module.register_parameter("_commlib_flat_shard", group.shard)
    module._commlib_fsdp = group
    hooks = []

    def pre(mod, args):
        _schedule.enter(group)
        group.unshard(torch.is_grad_enabled() and group.shard.requires_grad)
        group.prefetch_next()
        ctx = torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)
        ctx.__enter__()
        hooks.append(ctx)

    def post(mod, args, out):
        _schedule.depth -= 1
        _schedule.done.append(group)
        hooks.pop().__exit__(None, None, None)
        if reshard_after_forward:
            group.reshard()

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post, always_call=True)  # (also when forward raises)
    return module


def _drive(module, root: _Root):
    """fully_shard of a module that owns no parameters (see _Root)."""
    module._commlib_fsdp_root = root

    def pre(mod, args):
        _schedule.enter(root)
        root.prefetch_next()

    def post(mod, args, out):
        _schedule.depth -= 1
        _schedule.done.append(root)

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post, always_call=True)
    return module


def groups_of(module) -> list:
    """The fully_shard groups under ``module`` (itself included), in module
    order ([] if none): each with its process set, parameters and shard."""
    return [m._commlib_fsdp for m in module.modules()
            if getattr(m, "_commlib_fsdp", None) is not None]


@contextmanager
def full_parameters(module, writeback=True):
    """Gathers the whole parameters of every fully_shard module under
    ``module`` (collective over their sets) for reading or changing them;
    with ``writeback``, changes go back into the shards on exit."""
    groups = groups_of(module)
    _schedule.new_pass()  # (a prefetched gather may predate a step)
    with torch.no_grad():
        for g in groups:
            g.unshard(grad=False)
        try:
            yield module
        finally:
            for g in groups:
                if writeback and g.whole is not None:
                    a, b = g.plan.owned(set_rank(g.process_set))
                    g.shard.copy_(g.whole[a:b])
                g.reshard()

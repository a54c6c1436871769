"""The torch side of a ZeRO bucket (commlib.sharding.Bucket): one flat,
padded buffer holding a group of parameters end to end, the parameters
re-pointed to views of it, and this rank's shard as a leaf tensor that a
shard-sized optimizer updates in place."""
from __future__ import annotations

import torch

from commlib.sharding import Bucket


class FlatBucket:
    """Parameters ``params`` (in the order of ``plan.slots``) moved into one
    flat buffer; ``shard`` (a view of this rank's part) is what the inner
    optimizer steps. Both stages reduce-scatter the parameters' gradients
    into ``grad_shard``, kept across steps, which becomes ``shard.grad``.
    ``grad_flat`` is stage 1's flat gradient, made by its first explicit
    ``synchronize()`` (``p.grad`` are then views of it)."""

    def __init__(self, plan: Bucket, params: list, pos: int):
        self.plan = plan
        self.params = params
        self._index = {id(p): i for i, p in enumerate(params)}
        self.pos = pos
        dtype = params[0].dtype
        self.flat = torch.zeros(plan.padded, dtype=dtype)
        for p, s in zip(params, plan.slots):
            view = self.flat[s.offset:s.offset + s.numel]
            view.copy_(p.detach().reshape(-1))
            p.data = view.view(p.shape)
        a, b = plan.owned(pos)
        self.shard = torch.nn.Parameter(self.flat[a:b])
        self.grad_flat = None
        self.grad_shard = torch.zeros(b - a, dtype=dtype)  # this rank's averaged gradient
        self.handle = None  # the gradient collective in flight
        self.ready = 0  # parameters whose gradient is final for this step

    def slot_of(self, p):
        return self.plan.slots[self._index[id(p)]]

    def grad_view(self, p) -> torch.Tensor:
        s = self.slot_of(p)
        return self.grad_flat[s.offset:s.offset + s.numel].view(p.shape)

    def keep_flat_grad(self) -> None:
        """Stage 1's flat gradient (made once): ``p.grad`` become its views,
        keeping their values (None: zero)."""
        if self.grad_flat is None:
            self.grad_flat = torch.zeros(self.plan.padded, dtype=self.flat.dtype)
        for p in self.params:
            self.adopt_grad(p)

    def adopt_grad(self, p) -> None:
        """Stage 1: makes ``p.grad`` the view of the flat gradient again if
        autograd (or the user) replaced it, keeping its value (None: zero)."""
        view = self.grad_view(p)
        g = p.grad
        if g is not None and g.data_ptr() == view.data_ptr():
            return
        if g is None:
            view.zero_()
        else:
            view.copy_(g.to_dense() if g.is_sparse else g)
        p.grad = view

    def grads(self) -> list:
        """The parameters' gradients (None where a parameter has none), in
        slot order. Stage 2 drops them (``drop_grads``) once the reduction has
        finished, not earlier: freeing them in the middle of backward, while
        autograd allocates the next ones, made glibc return and fault in those
        pages again (their lifetime is that of unsharded training's)."""
        return [p.grad for p in self.params]

    def drop_grads(self) -> None:
        for p in self.params:
            p.grad = None

    def zero_grad(self, set_to_none: bool) -> None:
        """Stage 1 with ``set_to_none``: ``p.grad`` become None (the flat
        gradient stays allocated; the next backward's gradients are copied
        into it as they become final, cheaper than zeroing it and letting
        autograd add to it)."""
        self.shard.grad = None
        if self.grad_flat is not None and not set_to_none:
            self.grad_flat.zero_()
            for p in self.params:
                p.grad = self.grad_view(p)
            return
        for p in self.params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.zero_()

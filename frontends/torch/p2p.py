"""Point-to-point messages on torch tensors, differentiable.

    import commlib.torch as hvd
    if hvd.rank() == 0:
        h = model_part1(x)
        token = hvd.send(h, dst=1, tag=3)       # h's gradient will come back from rank 1
        token.backward()                        # waits for it, then backpropagates into part 1
    else:
        h = hvd.recv(src=0, tag=3, requires_grad=True)   # shape and dtype come with the message
        loss = loss_fn(model_part2(h), y)
        loss.backward()                         # sends h's gradient back to rank 0

The semantics are the numpy API's (``commlib.send`` ...): the receiver
learns the dtype and shape, messages are matched by (source, tag, process
set), ``dst``/``src`` are job ranks, and a send returns once its receiver
has taken the data.

Autograd pairs: a ``send`` in forward becomes a receive of the gradient in
backward, and a ``recv(requires_grad=True)`` becomes a send of the gradient.
The gradient of a message with tag ``t`` travels back with tag
``gradient_tag(t)`` (t + 2**62), so differentiable messages use tags below
2**62. ``sendrecv`` is differentiable too: its backward is the reverse
exchange. ``isend``/``irecv`` are not differentiable (pipelines that post
their own gradient messages use them). CPU tensors only.
"""
from __future__ import annotations

import numpy as np
import torch

import commlib as _c
from commlib.p2p import blocking_at, plain_peer_and_tag
from commlib.pipeline.tags import check_forward_tag, gradient_tag
from commlib.submit import NULL, address, shape_array

from .mpi_ops import Handle, check_tensor
from .tensor_io import core_code

__all__ = ["send", "recv", "isend", "irecv", "sendrecv", "gradient_tag"]


def _array(tensor, what: str) -> np.ndarray:
    """A numpy view of ``tensor`` (a contiguous copy when it is not); 0-d
    tensors stay 0-d, so the receiver gets the same shape."""
    t = check_tensor(tensor, what).detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: ml_dtypes' (check_tensor has checked)
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _tensor(arr: np.ndarray) -> torch.Tensor:
    if not arr.flags.writeable:  # torch.from_numpy warns on read-only memory
        arr = arr.copy()
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _out_array(out, what: str):
    if out is None:
        return None
    check_tensor(out, what, inplace=True)
    return _array(out, what)


def isend(tensor, dst, tag=0, process_set=None) -> Handle:
    """Starts sending ``tensor`` to job rank ``dst``; ``synchronize`` returns
    None once the receiver has taken it. Keep the tensor unchanged until then."""
    arr = _array(tensor, "isend")
    return Handle(_c.isend(arr, dst, tag, process_set), lambda _none: None, (tensor, arr))


def irecv(src, tag=0, out=None, process_set=None) -> Handle:
    """Starts receiving the next message from job rank ``src`` with ``tag``;
    ``synchronize`` returns ``out`` (filled in) or a new tensor of the
    message's dtype and shape."""
    arr = _out_array(out, "irecv")
    h = _c.irecv(src, tag, arr, process_set)
    if out is not None:
        return Handle(h, lambda _arr: out, out)
    return Handle(h, _tensor, None)


def _fast(send: bool, tensor, peer, tag, process_set) -> bool:
    """A blocking send of, or receive into, a plain contiguous CPU tensor of
    at least one dimension (int peer and tag, the global set) straight into
    the core, without a numpy view; False: take the long way (which also
    raises the errors)."""
    if process_set is not None or not plain_peer_and_tag(peer, tag) or type(tensor) is not torch.Tensor:
        return False
    code = core_code(tensor.dtype)
    if (code is None or not tensor.is_cpu or tensor.layout is not torch.strided or tensor.dim() == 0
            or not tensor.is_contiguous()):
        return False
    ptr = address(tensor.data_ptr()) if tensor.numel() else NULL
    blocking_at(send, code, tensor.dim(), shape_array(tensor.shape), ptr, peer, tag, tensor)
    return True


def _send_now(tensor, dst, tag, process_set) -> None:
    if not _fast(True, tensor, dst, tag, process_set):
        _c.send(_array(tensor, "send"), dst, tag, process_set)


def _recv_now(src, tag, out, process_set) -> torch.Tensor:
    if out is not None and _fast(False, out, src, tag, process_set):
        return out
    arr = _c.recv(src, tag, _out_array(out, "recv"), process_set)
    return out if out is not None else _tensor(arr)


class _Send(torch.autograd.Function):
    """Forward: send x. Backward: receive x's gradient from the receiver."""

    @staticmethod
    def forward(ctx, x, dst, tag, process_set):
        ctx.meta = (dst, tag, process_set, x.shape, x.dtype)
        _send_now(x, dst, tag, process_set)
        return x.new_zeros(())

    @staticmethod
    def backward(ctx, _grad_token):
        dst, tag, process_set, shape, dtype = ctx.meta
        grad = _recv_now(dst, gradient_tag(tag), torch.empty(shape, dtype=dtype), process_set)
        return grad, None, None, None


class _Recv(torch.autograd.Function):
    """Forward: receive. Backward: send the gradient to the sender."""

    @staticmethod
    def forward(ctx, _anchor, src, tag, process_set):
        ctx.meta = (src, tag, process_set)
        return _recv_now(src, tag, None, process_set)

    @staticmethod
    def backward(ctx, grad):
        src, tag, process_set = ctx.meta
        _send_now(grad, src, gradient_tag(tag), process_set)
        return None, None, None, None


def send(tensor, dst, tag=0, process_set=None) -> torch.Tensor:
    """Sends ``tensor`` to job rank ``dst``; returns once the receiver took it.

    Returns a 0-d zero token. When ``tensor`` requires grad, the token is
    part of the graph: its backward (``token.backward()``, or adding it to a
    loss) receives the tensor's gradient from ``dst`` (the receiver's
    ``recv(requires_grad=True)`` sends it) and backpropagates it."""
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        check_forward_tag(tag)
        return _Send.apply(tensor, dst, tag, process_set)
    _send_now(tensor, dst, tag, process_set)
    return torch.zeros(())


def recv(src, tag=0, out=None, process_set=None, requires_grad=False) -> torch.Tensor:
    """Receives the next message from job rank ``src`` with ``tag``: ``out``
    filled in, or a new tensor of the sender's dtype and shape.

    With ``requires_grad=True`` the tensor is part of the graph: its gradient
    is sent back to ``src`` during backward (the sender's token receives it).
    """
    if requires_grad:
        if out is not None:
            raise ValueError("recv: requires_grad=True returns a new tensor; leave out=None")
        check_forward_tag(tag)
        anchor = torch.empty(0, requires_grad=True)
        with torch.enable_grad():
            return _Recv.apply(anchor, src, tag, process_set)
    return _recv_now(src, tag, out, process_set)


class _SendRecv(torch.autograd.Function):
    """Forward: the exchange. Backward: the reverse exchange of gradients."""

    @staticmethod
    def forward(ctx, x, dst, src, send_tag, recv_tag, process_set):
        ctx.meta = (dst, src, send_tag, recv_tag, process_set, x.shape, x.dtype)
        return _sendrecv_now(x, dst, src, send_tag, recv_tag, None, process_set)

    @staticmethod
    def backward(ctx, grad):
        dst, src, send_tag, recv_tag, process_set, shape, dtype = ctx.meta
        out = torch.empty(shape, dtype=dtype)
        g = _sendrecv_now(grad, src, dst, gradient_tag(recv_tag), gradient_tag(send_tag), out,
                          process_set)
        return g, None, None, None, None, None


def _sendrecv_now(tensor, dst, src, send_tag, recv_tag, out, process_set) -> torch.Tensor:
    arr = _c.sendrecv(_array(tensor, "sendrecv"), dst, src, send_tag, recv_tag,
                      _out_array(out, "sendrecv"), process_set)
    return out if out is not None else _tensor(arr)


def sendrecv(tensor, dst, src, send_tag=0, recv_tag=0, out=None,
             process_set=None) -> torch.Tensor:
    """Sends ``tensor`` to ``dst`` and receives from ``src`` at once (both
    posted before either waits); returns the received tensor.

    Differentiable when ``tensor`` requires grad (then on every rank of the
    exchange): backward sends the output's gradient to ``src`` and receives
    the input's gradient from ``dst``."""
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad and torch.is_grad_enabled():
        if out is not None:
            raise ValueError("sendrecv: a differentiable exchange returns a new tensor; "
                             "leave out=None")
        check_forward_tag(send_tag)
        check_forward_tag(recv_tag)
        return _SendRecv.apply(tensor, dst, src, send_tag, recv_tag, process_set)
    return _sendrecv_now(tensor, dst, src, send_tag, recv_tag, out, process_set)

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
their own gradient messages use them).

CUDA tensors go through NCCL when it is usable (cuda_p2p): a send hands
the core the tensor's device memory and current stream, and a receive in a
process that can use NCCL takes a device message straight into device
memory (a CUDA ``out``, or a new tensor on ``device``), a host message as
before; senders and receivers may mix host and CUDA tensors. Without NCCL
(or with COMMLIB_GPU_BACKEND=host) CUDA tensors are staged through pinned
host memory (cuda_staging): a send copies the tensor to the host (after the
kernels queued on the current stream) and sends that; a receive into a CUDA
``out`` receives into a host buffer and copies it in. Either way ``device=``
puts a received tensor of unknown shape on a device, and ``sendrecv`` and
the autograd pairs keep their tensors on the device they came from.
"""
from __future__ import annotations

import numpy as np
import torch

import commlib as _c
from commlib.p2p import blocking_at, plain_peer_and_tag
from commlib.pipeline.tags import check_forward_tag, gradient_tag

from ..cuda import cuda_p2p
from ..cuda.cuda_staging import host_buffer, stage_in
from .handles import synchronize
from ..mpi_ops import Handle, check_tensor
from .tensor_io import cached_facts, check_receive_target, core_code, describe

__all__ = ["send", "recv", "isend", "irecv", "sendrecv", "gradient_tag"]


def _staged(tensor) -> bool:
    """Whether ``tensor`` travels through host memory (a device tensor).
    (Tests of the staging steps on CPU-only machines stage every tensor.)"""
    return not tensor.is_cpu


def _array(tensor, what: str) -> np.ndarray:
    """A numpy view of ``tensor`` (a contiguous copy when it is not; a host
    copy of a device tensor); 0-d tensors stay 0-d, so the receiver gets the
    same shape. The view keeps its tensor alive."""
    t = check_tensor(tensor, what).detach()
    if _staged(t):
        t = stage_in(t)
    elif not t.is_contiguous():
        t = t.contiguous()
    return _view(t)


def _view(t: torch.Tensor) -> np.ndarray:
    """The numpy view of a contiguous host tensor."""
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: ml_dtypes' (check_tensor has checked)
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _tensor(arr: np.ndarray, device=None) -> torch.Tensor:
    if not arr.flags.writeable:  # torch.from_numpy warns on read-only memory
        arr = arr.copy()
    if arr.dtype.name == "bfloat16":
        t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(arr)
    return t if device is None else t.to(device)


def _receiver(out, what: str, device=None):
    """What a receive into ``out`` (or into a new tensor, put on ``device``)
    hands the core, and how the core's result becomes the caller's tensor:
    (numpy out or None, finish(result array) -> tensor)."""
    device = check_receive_target(out, device, what)
    if out is None:
        return None, lambda arr: _tensor(arr, device)
    if not _staged(out):
        return _array(out, what), lambda _arr: out
    host = host_buffer(out)

    def finish(_arr):
        out.copy_(host)
        return out
    return _view(host), finish


def isend(tensor, dst, tag=0, process_set=None) -> Handle:
    """Starts sending ``tensor`` to job rank ``dst``; ``synchronize`` returns
    None once the receiver has taken it. Keep the tensor unchanged until then
    (a CUDA tensor staged through host memory is copied there before this
    returns)."""
    if cuda_p2p.is_nccl_tensor(tensor):
        return cuda_p2p.isend(tensor, dst, tag, process_set)
    arr = _array(tensor, "isend")
    return Handle(_c.isend(arr, dst, tag, process_set), lambda _none: None, (tensor, arr))


def irecv(src, tag=0, out=None, process_set=None, device=None) -> Handle:
    """Starts receiving the next message from job rank ``src`` with ``tag``;
    ``synchronize`` returns ``out`` (filled in) or a new tensor of the
    message's dtype and shape (on ``device``, default the CPU)."""
    if cuda_p2p.takes_device_messages():
        return cuda_p2p.irecv(src, tag, out, process_set, device, "irecv", lambda o: _array(o, "irecv"),
                              _tensor)
    arr, finish = _receiver(out, "irecv", device)
    return Handle(_c.irecv(src, tag, arr, process_set), finish, (out, arr))


def _fast(send: bool, tensor, peer, tag, process_set) -> bool:
    """A blocking send of, or receive into, a plain contiguous CPU tensor of
    at least one dimension (int peer and tag, the global set) straight into
    the core, without a numpy view; False: take the long way (which also
    raises the errors)."""
    if process_set is not None or not plain_peer_and_tag(peer, tag) or type(tensor) is not torch.Tensor:
        return False
    f = cached_facts(tensor)
    if f is None:
        if (core_code(tensor.dtype) is None or not tensor.is_cpu or tensor.layout is not torch.strided
                or not tensor.is_contiguous()):
            return False
        f = describe(tensor, "send" if send else "recv")
    if f.tshape == ():  # (0-d: the long way says why not)
        return False
    blocking_at(send, f, peer, tag, tensor)
    return True


def _send_now(tensor, dst, tag, process_set) -> None:
    if cuda_p2p.is_nccl_tensor(tensor):
        synchronize(cuda_p2p.isend(tensor, dst, tag, process_set))
    elif not _fast(True, tensor, dst, tag, process_set):
        _c.send(_array(tensor, "send"), dst, tag, process_set)


def _recv_now(src, tag, out, process_set, device=None) -> torch.Tensor:
    if cuda_p2p.takes_device_messages():
        return synchronize(irecv(src, tag, out, process_set, device))
    if out is not None and device is None and _fast(False, out, src, tag, process_set):
        return out
    arr, finish = _receiver(out, "recv", device)
    return finish(_c.recv(src, tag, arr, process_set))


class _Send(torch.autograd.Function):
    """Forward: send x. Backward: receive x's gradient from the receiver."""

    @staticmethod
    def forward(ctx, x, dst, tag, process_set):
        ctx.meta = (dst, tag, process_set, x.shape, x.dtype, x.device)
        _send_now(x, dst, tag, process_set)
        return x.new_zeros(())

    @staticmethod
    def backward(ctx, _grad_token):
        dst, tag, process_set, shape, dtype, device = ctx.meta
        grad = _recv_now(dst, gradient_tag(tag), torch.empty(shape, dtype=dtype, device=device), process_set)
        return grad, None, None, None


class _Recv(torch.autograd.Function):
    """Forward: receive. Backward: send the gradient to the sender."""

    @staticmethod
    def forward(ctx, _anchor, src, tag, process_set, device):
        ctx.meta = (src, tag, process_set)
        return _recv_now(src, tag, None, process_set, device)

    @staticmethod
    def backward(ctx, grad):
        src, tag, process_set = ctx.meta
        _send_now(grad, src, gradient_tag(tag), process_set)
        return None, None, None, None, None


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


def recv(src, tag=0, out=None, process_set=None, requires_grad=False, device=None) -> torch.Tensor:
    """Receives the next message from job rank ``src`` with ``tag``: ``out``
    filled in, or a new tensor of the sender's dtype and shape, on ``device``
    (default the CPU; ``device="cuda"`` for a pipeline stage on a GPU).

    With ``requires_grad=True`` the tensor is part of the graph: its gradient
    is sent back to ``src`` during backward (the sender's token receives it).
    """
    if requires_grad:
        if out is not None:
            raise ValueError("recv: requires_grad=True returns a new tensor; leave out=None")
        check_forward_tag(tag)
        anchor = torch.empty(0, requires_grad=True)
        with torch.enable_grad():
            return _Recv.apply(anchor, src, tag, process_set, device)
    return _recv_now(src, tag, out, process_set, device)


class _SendRecv(torch.autograd.Function):
    """Forward: the exchange. Backward: the reverse exchange of gradients."""

    @staticmethod
    def forward(ctx, x, dst, src, send_tag, recv_tag, process_set):
        ctx.meta = (dst, src, send_tag, recv_tag, process_set, x.shape, x.dtype)
        return _sendrecv_now(x, dst, src, send_tag, recv_tag, None, process_set)

    @staticmethod
    def backward(ctx, grad):
        dst, src, send_tag, recv_tag, process_set, shape, dtype = ctx.meta
        out = torch.empty(shape, dtype=dtype, device=grad.device)
        g = _sendrecv_now(grad, src, dst, gradient_tag(recv_tag), gradient_tag(send_tag), out,
                          process_set)
        return g, None, None, None, None, None


def _sendrecv_now(tensor, dst, src, send_tag, recv_tag, out, process_set) -> torch.Tensor:
    device = tensor.device if out is None and not tensor.is_cpu else None  # (back where it came from)
    if cuda_p2p.takes_device_messages() or cuda_p2p.is_nccl_tensor(tensor):
        check_tensor(tensor, "sendrecv")
        r = irecv(src, recv_tag, out, process_set, device)
        s = isend(tensor, dst, send_tag, process_set)
        result = synchronize(r)
        synchronize(s)
        return result
    payload = _array(tensor, "sendrecv")
    arr, finish = _receiver(out, "sendrecv", device)
    return finish(_c.sendrecv(payload, dst, src, send_tag, recv_tag, arr, process_set))


def sendrecv(tensor, dst, src, send_tag=0, recv_tag=0, out=None,
             process_set=None) -> torch.Tensor:
    """Sends ``tensor`` to ``dst`` and receives from ``src`` at once (both
    posted before either waits); returns the received tensor (on
    ``tensor``'s device unless ``out`` is given).

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

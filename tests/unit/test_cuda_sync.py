"""commlib.torch.synchronize routes a collective on CUDA tensors through
NCCL (a core handle with a device) to synchronize_on_stream with the current
stream of its device under COMMLIB_CUDA_SYNC=stream (the default), and to the
host wait under COMMLIB_CUDA_SYNC=host; CPU handles always wait on the host.
One process, no MPI: the core calls and torch.cuda are stood in for."""
import pytest

torch = pytest.importorskip("torch")

import commlib  # noqa: E402
import commlib.gpu  # noqa: E402
import commlib.torch.collectives.handles as th  # noqa: E402


class _Stream:
    def __init__(self, device):
        self.cuda_stream = 1000 + device


@pytest.fixture
def calls(monkeypatch):
    seen = []
    monkeypatch.setattr(th, "synchronize_on_stream", lambda h, s: seen.append(("stream", h.device, s)) or h)
    monkeypatch.setattr(th._c, "synchronize", lambda h: seen.append(("host", h.device)) or h)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream(device))
    monkeypatch.setattr(commlib.gpu, "_sync_mode", [])
    return seen


def _handle(hid, device):
    return commlib.Handle(hid, None, None, "allreduce", device=device)


def test_cuda_handles_wait_on_their_stream_by_default(calls, monkeypatch):
    monkeypatch.delenv("COMMLIB_CUDA_SYNC", raising=False)
    cuda, cpu = _handle(-101, 1), _handle(-102, None)
    assert th.synchronize(cuda) is cuda
    assert th.synchronize(cpu) is cpu
    group = th.Handle([_handle(-103, 0), _handle(-104, 0)], list)
    th.synchronize(group)
    assert calls == [("stream", 1, 1001), ("host", None), ("stream", 0, 1000), ("stream", 0, 1000)]


def test_host_mode_waits_on_the_host(calls, monkeypatch):
    monkeypatch.setenv("COMMLIB_CUDA_SYNC", "host")
    th.synchronize(th.Handle(_handle(-105, 0), lambda r: r))
    assert calls == [("host", 0)]


def test_a_bad_mode_is_refused(calls, monkeypatch):
    monkeypatch.setenv("COMMLIB_CUDA_SYNC", "device")
    with pytest.raises(ValueError, match="COMMLIB_CUDA_SYNC='device'"):
        th.synchronize(_handle(-106, 0))

"""commlib.torch's repeated in-place allreduce of a CUDA tensor under one
name (DistributedOptimizer's gradient hooks, step after step) submits the
request its first call built again, and builds a new one whenever anything
it depends on changed (frontends/torch/cuda/cuda_nccl.py, allreduce_again).

One process, no GPU and no MPI: a torch.Tensor subclass says it is a CUDA
tensor on device 0, the current stream is a number the test sets, and the
core's submit records the C requests it is given; tests/gpu runs the same
calls on a GPU with the results checked."""
import types

import pytest

torch = pytest.importorskip("torch")

import commlib.submit as core_submit  # noqa: E402
import commlib.torch as hvd  # noqa: E402
from commlib import device_ops, gpu  # noqa: E402
from commlib._lib import ffi, lib  # noqa: E402
from commlib.torch.cuda import cuda_nccl  # noqa: E402


class FakeCuda(torch.Tensor):
    is_cuda = True
    is_cpu = False
    device = torch.device("cuda", 0)


def cuda(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype).as_subclass(FakeCuda)


@pytest.fixture
def core(monkeypatch):
    """What reaches the core: the C requests submitted, and the builds."""
    seen = types.SimpleNamespace(requests=[], builds=0, stream=4096)
    ids = iter(range(1, 1 << 30))

    def submit(r):
        seen.requests.append(r)
        return next(ids)

    build = device_ops.build

    def counted_build(*a, **k):
        seen.builds += 1
        return build(*a, **k)

    monkeypatch.setattr(gpu, "cuda_path", lambda: "nccl")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: types.SimpleNamespace(cuda_stream=seen.stream))
    monkeypatch.setattr(device_ops, "ensure_loaded", lambda: None)
    monkeypatch.setattr(device_ops, "submit_request", submit)
    monkeypatch.setattr(core_submit, "submit", submit)
    monkeypatch.setattr(device_ops, "build", counted_build)
    monkeypatch.setattr(cuda_nccl, "_again", {})
    return seen


def address(ptr) -> int:
    return int(ffi.cast("uintptr_t", ptr))


def test_a_repeated_call_submits_its_first_request_again(core):
    g = cuda(6)
    first = hvd.allreduce_async_(g, name="grad.w", op=hvd.Average)
    again = hvd.allreduce_async_(g, name="grad.w", op=hvd.Average)
    assert core.builds == 1 and len(core.requests) == 2
    assert core.requests[0] is core.requests[1]
    r = core.requests[0].c
    assert address(r.input) == address(r.output) == g.data_ptr()
    assert r.device_type == lib.COMMLIB_DEVICE_CUDA and r.device_id == 0 and address(r.stream) == 4096
    assert ffi.string(r.name) == b"grad.w" and r.reduce_op == hvd.Average
    for h in (first, again):  # (synchronize returns the tensor itself, waiting on its device's stream)
        core_handle = h._handles
        assert core_handle.device == 0 and core_handle._result is g


def test_a_new_gradient_tensor_of_the_same_name_moves_the_request(core):
    # (zero_grad() makes new gradient tensors every step)
    old, new = cuda(4, 3), cuda(4, 3)
    hvd.allreduce_async_(old, name="grad.w")
    hvd.allreduce_async_(new, name="grad.w")
    assert core.builds == 1 and core.requests[0] is core.requests[1]
    r = core.requests[1].c
    assert address(r.input) == address(r.output) == new.data_ptr() != old.data_ptr()
    hvd.allreduce_async_(new, name="grad.w")
    assert core.builds == 1 and address(core.requests[2].c.input) == new.data_ptr()


@pytest.mark.parametrize("change", ["op", "prescale", "postscale", "dtype", "shape", "stream"])
def test_anything_else_that_changed_builds_a_new_request(core, change):
    g = cuda(5)
    kw = dict(name="grad.w", op=hvd.Sum, prescale_factor=1.0, postscale_factor=1.0)
    hvd.allreduce_async_(g, **kw)
    if change == "op":
        kw["op"] = hvd.Max
    elif change in ("prescale", "postscale"):
        kw[change + "_factor"] = 0.5
    elif change == "dtype":
        g = cuda(5, dtype=torch.float16)
    elif change == "shape":
        g = cuda(6)
    else:
        core.stream = 8192
    hvd.allreduce_async_(g, **kw)
    assert core.builds == 2 and core.requests[0] is not core.requests[1]
    r = core.requests[1].c
    assert address(r.input) == g.data_ptr() and address(r.stream) == core.stream
    if change == "op":
        assert r.reduce_op == hvd.Max
    if change == "shape":
        assert r.ndim == 1 and r.shape[0] == 6
    # and the new request is the one submitted again from now on
    hvd.allreduce_async_(g, **kw)
    assert core.builds == 2 and core.requests[2] is core.requests[1]


def test_only_named_global_set_cuda_calls_repeat(core, monkeypatch):
    g = cuda(3)
    hvd.allreduce_async_(g, name="grad.w")
    assert cuda_nccl.allreduce_again(torch.zeros(3), "grad.w", None, 1.0, 1.0) is None  # a CPU tensor
    assert cuda_nccl.allreduce_again(g, "grad.other", None, 1.0, 1.0) is None
    assert cuda_nccl.allreduce_again(g, "grad.w", None, 1.0, 1.0) is not None
    monkeypatch.setattr(gpu, "cuda_path", lambda: "host")  # (routing changed: the checked way decides)
    assert cuda_nccl.allreduce_again(g, "grad.w", None, 1.0, 1.0) is None
    monkeypatch.setattr(gpu, "cuda_path", lambda: "nccl")
    # generated names are never remembered: each call has its own
    hvd.allreduce_async_(g)
    hvd.allreduce_async_(g)
    assert list(cuda_nccl._again) == ["grad.w"]


def test_a_non_contiguous_tensor_is_refused_even_after_a_repeat(core):
    g = cuda(4, 4)
    hvd.allreduce_async_(g, name="grad.w")
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce_async_(cuda(4, 4).t(), name="grad.w")


def test_synchronizing_a_steps_gradients_polls_linearly(monkeypatch):
    # Each synchronize on a stream forgets the buffers of completed detached
    # handles. A step synchronizes its gradients while the device still runs
    # them: polling every detached handle each time made that O(n^2) polls.
    import commlib.handle as handle

    completed, polls = set(), [0]

    def poll(hid):
        polls[0] += 1
        return hid in completed

    monkeypatch.setattr(handle, "lib", types.SimpleNamespace(commlib_poll=poll))
    monkeypatch.setattr(handle, "_detached", {})
    monkeypatch.setattr(handle, "_full_scan_at", [handle._FULL_SCAN_MIN])
    for step in range(3):
        ids = range(1000 * step, 1000 * step + 300)
        for hid in ids:  # (as synchronize_on_stream: drop the completed, then detach this one)
            handle._drop_completed_detached()
            handle._detached[hid] = None
        assert polls[0] < 4 * 300 * (step + 1), polls  # (every one each time: ~45,000 a step)
        completed.update(ids)  # the device completes the step
    handle._drop_completed_detached()
    assert not handle._detached
    # one handle that never completes (another process set's, say) keeps
    # the others' buffers only until the next full scan
    monkeypatch.setattr(handle, "_detached", {})
    monkeypatch.setattr(handle, "_full_scan_at", [handle._FULL_SCAN_MIN])
    completed.clear()
    handle._detached[-1] = None
    for hid in range(1, 1000):
        completed.add(hid)
        handle._drop_completed_detached()
        handle._detached[hid] = None
        assert len(handle._detached) <= handle._FULL_SCAN_MIN + 1
    assert -1 in handle._detached

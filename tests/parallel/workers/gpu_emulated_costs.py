"""Run by tests/parallel/test_gpu_step_costs.py: what a training step's
collectives on CUDA buffers cost the process, counted by the GPU emulator
(tests/gpu_emulator/: commlib_gpu_emulator_count) while the core's NCCL
executor runs them. "Device" buffers are numpy arrays, stream 0 the
emulator's legacy default stream.

argv[1]:
- step N: three training steps of an N-parameter model as DistributedOptimizer
  submits them on CUDA (one in-place Average allreduce per gradient, named
  "grad.<parameter>", every one submitted before the first is waited for,
  then each synchronized on the stream);
- backward N: two steps whose N gradients arrive one by one, 200 us apart,
  as a backward pass's hooks submit them on the GPU, and are waited for only
  once all are submitted (run with a small COMMLIB_GPU_BUCKET_BYTES): prints
  ``BUCKETS <step> <full buckets> <launches before the wait> <launches>``;
- broadcast N: N broadcasts from rank 0 submitted together and then waited
  for, as broadcast_parameters submits a model's parameters, twice; then one
  broadcast alone, repeated.
Results are checked on every rank; rank 0 prints one line per phase,
``COUNTS <phase> <json>``, with what the phase added to each count (step1;
later: the next two steps, with the checks' own stream waits taken out).
"""
import ctypes
import json
import os
import sys
import time

import numpy as np

import commlib
from commlib import device_ops
from commlib._lib import lib
from commlib.device_ops import DeviceBuffer
from commlib.dtypes import dtype_code
from commlib.handle import synchronize, synchronize_on_stream
from _common import check_equal, done, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
EMULATOR = ctypes.CDLL(os.environ["COMMLIB_NCCL_LIBRARY"])
EMULATOR.commlib_gpu_emulator_count.restype = ctypes.c_long
EMULATOR.commlib_gpu_emulator_count.argtypes = [ctypes.c_char_p]
KINDS = ("comm_init", "stream_create", "event_create", "malloc", "free", "host_alloc", "sync", "copy",
         "nccl_call", "allreduce", "broadcast", "group")


def counts() -> dict:
    return {k: EMULATOR.commlib_gpu_emulator_count(k.encode()) for k in KINDS}


OWN_SYNCS = [0]  # the checks' own waits for the stream (taken out of the counts)


def report(phase: str, before: dict) -> dict:
    now = counts()
    added = {k: now[k] - before[k] for k in KINDS}
    added["sync"] -= OWN_SYNCS[0]
    OWN_SYNCS[0] = 0
    if r == 0:
        print(f"COUNTS {phase} {json.dumps(added)}", flush=True)
    return now


def submit(op_type, name, x, out, **kw):
    buf = DeviceBuffer(x.ctypes.data, dtype_code(x.dtype), x.shape)
    return device_ops.submit(op_type, name, buf, out.ctypes.data, device=0, stream=0, keepalive=(x, out),
                             value=out, **kw)


def wait_device():
    """The caller waits for its stream (a test's own host round trip, outside the counts)."""
    EMULATOR.cudaStreamSynchronize(None)
    OWN_SYNCS[0] += 1


def sizes(count):
    """ResNet-like: many small tensors (biases, norms) between larger ones."""
    return [64 if i % 3 else 64 * (1 + i % 17) * 9 for i in range(count)]


def step(count, salt):
    grads = [np.full(s, float(r + 1 + salt + i % 5), np.float32) for i, s in enumerate(sizes(count))]
    handles = [submit(lib.COMMLIB_OP_ALLREDUCE, f"grad.layer{i:03d}.weight", g, g, reduce_op=commlib.Average)
               for i, g in enumerate(grads)]
    for h in handles:
        synchronize_on_stream(h, 0)
    return grads


def check_step(grads, count, salt):
    wait_device()
    for i, g in enumerate(grads):
        want = np.full(g.shape, np.mean([q + 1 + salt + i % 5 for q in range(n)]), np.float32)
        check_equal(g, want, f"gradient {i} of step {salt}")


def case_step(count):
    c = counts()
    grads = step(count, 0)
    report("step1", c)
    check_step(grads, count, 0)
    OWN_SYNCS[0] = 0
    c = counts()
    for salt in (1, 2):
        grads = step(count, salt)
        check_step(grads, count, salt)
    report("later", c)


def case_backward(count):
    bucket = int(os.environ["COMMLIB_GPU_BUCKET_BYTES"])
    for salt in (1, 2):  # (the first step negotiated, the second from the response cache)
        c = counts()
        grads = [np.full(s, float(r + 1 + salt + i % 5), np.float32) for i, s in enumerate(sizes(count))]
        handles = []
        for i, g in enumerate(grads):
            handles.append(submit(lib.COMMLIB_OP_ALLREDUCE, f"grad.layer{i:03d}.weight", g, g,
                                  reduce_op=commlib.Average))
            start = time.perf_counter()
            while time.perf_counter() - start < 200e-6:
                pass
        full, held = 0, 0  # the buckets the rule closes before anyone waits
        for g in grads:
            held += g.nbytes
            if held >= bucket:
                full, held = full + 1, 0
        deadline = time.monotonic() + 3
        while counts()["allreduce"] - c["allreduce"] < full and time.monotonic() < deadline:
            time.sleep(0.001)
        before_wait = counts()["allreduce"] - c["allreduce"]
        for h in handles:
            synchronize_on_stream(h, 0)
        launches = counts()["allreduce"] - c["allreduce"]
        check_step(grads, count, salt)
        if r == 0:
            print(f"BUCKETS {salt} {full} {before_wait} {launches}", flush=True)


def case_broadcast(count):
    c = counts()
    for rnd in (1, 2):
        params = [np.full(s, float(r * 100 + i + rnd), np.float32) for i, s in enumerate(sizes(count))]
        handles = [submit(lib.COMMLIB_OP_BROADCAST, f"param.{i}", p, p, root=0) for i, p in enumerate(params)]
        for h in handles:
            synchronize(h)
        c = report(f"parameters{rnd}", c)
        for i, p in enumerate(params):
            check_equal(p, np.full(p.shape, float(i + rnd), np.float32), f"parameter {i}")
    set_broadcast(count)
    c = counts()
    x = np.full(1024, float(r), np.float32)
    for _ in range(10):
        out = np.empty_like(x)
        synchronize(submit(lib.COMMLIB_OP_BROADCAST, "one", x, out, root=0))
        check_equal(out, np.zeros_like(x), "one broadcast")
    report("broadcast10", c)


def set_broadcast(count):
    """Broadcasts of mixed dtypes from the last rank, in flight together on a
    set without rank 0 (at 3 ranks or more: the root's rank in the set differs
    from its job rank), fused or not, arrive whole on every member."""
    if n < 3:
        return
    members = list(range(1, n))
    ps = commlib.add_process_set(members)
    if r in members:
        dtypes = [np.float32, np.int64, np.uint8, np.float64]
        params = [np.full(s, r * 10 + i, dtypes[i % 4]) for i, s in enumerate(sizes(count))]
        handles = [submit(lib.COMMLIB_OP_BROADCAST, f"set.param.{i}", p, p, root=n - 1,
                          process_set=ps.process_set_id) for i, p in enumerate(params)]
        for h in handles:
            synchronize(h)
        for i, p in enumerate(params):
            check_equal(p, np.full(p.shape, (n - 1) * 10 + i, dtypes[i % 4]), f"set broadcast {i}")
    commlib.remove_process_set(ps)


case, count = sys.argv[1], int(sys.argv[2])
{"step": case_step, "backward": case_backward, "broadcast": case_broadcast}.get(case, lambda _: fail(f"unknown case {case}"))(count)
done()

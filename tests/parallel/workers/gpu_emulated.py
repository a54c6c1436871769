"""Run by tests/parallel/test_gpu_emulated.py: the core's NCCL executor
(csrc/exec/gpu_*.cc, csrc/backends/nccl/) on CPU, against the GPU emulator
(tests/gpu_emulator/): "device" buffers are numpy arrays, stream 0 is the
emulator's legacy default stream. Every result is checked against numpy on
every rank and against the CPU path on the same data; values are small
integers, so every dtype and summation order is exact and results must be
equal, not close.

argv[1]:
- collectives: every collective x dtype x op, scale factors, uneven rows,
  names that repeat (the response cache), fusion of many small allreduces, a process set, and the refusals (an op or
  dtype NCCL does not run) raised on every rank alike;
- ordering (run with COMMLIB_GPU_EMULATOR_DELAY_US): the input is written by
  an asynchronous copy on the caller's stream just before the collective is
  submitted; the collective must wait for it, and its handle must complete
  only once the result is in place;
- stream (run with COMMLIB_GPU_EMULATOR_DELAY_US): synchronize_on_stream
  returns before the device has run the collective, and the caller's stream
  sees its result;
- join: a rank that joined stands in for the others' CUDA collectives;
- init-hang (run with COMMLIB_TIMEOUT and COMMLIB_GPU_EMULATOR_INIT_HANG_RANK):
  the communicator's creation never completes; the first CUDA collective
  fails by the timeout on every rank instead of hanging;
- sleeps, frozen, frozen-on-stream (run with COMMLIB_TIMEOUT): the last rank
  never submits a collective, or is stopped (SIGSTOP) inside it; the others
  fail with CollectiveTimeoutError naming it within the timeout + 10 s
  (frozen: their communicator is aborted; on-stream: the error comes from
  their next synchronize), and the job goes on.
"""
import ctypes
import os
import signal
import sys
import time

import numpy as np

import commlib
from commlib import device_ops
from commlib._lib import lib
from commlib.device_ops import DeviceBuffer
from commlib.handle import synchronize, synchronize_on_stream
from commlib.dtypes import dtype_code
from commlib.ops import reducescatter_rows
from _common import check_equal, done, expect_raises, fail, stop_process

try:
    import ml_dtypes
    BF16 = [np.dtype(ml_dtypes.bfloat16)]
except ImportError:  # (bfloat16 needs ml_dtypes, which tensorflow brings)
    BF16 = []

commlib.init()
r, n = commlib.rank(), commlib.size()
case = sys.argv[1]
EMULATOR = ctypes.CDLL(os.environ["COMMLIB_NCCL_LIBRARY"])
FLOATS = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)] + BF16
INTS = [np.dtype(t) for t in (np.int32, np.int64, np.uint8, np.int8)]
OPS = {"Sum": commlib.Sum, "Average": commlib.Average, "Min": commlib.Min, "Max": commlib.Max,
       "Product": commlib.Product}


def data(shape, dtype, salt, rank=None):
    """Rank `rank`'s input (this rank's by default): small integers."""
    g = np.random.default_rng(1000 * salt + (r if rank is None else rank))
    hi = 2 if dtype in (np.uint8, np.int8) else 4
    return g.integers(0, hi, size=shape).astype(dtype)


def device(op_type, name, inp, out, **kw):
    """The collective on the NCCL executor; inp and out stand for device memory."""
    buf = DeviceBuffer(inp.ctypes.data if inp.size else 0, dtype_code(inp.dtype), inp.shape or (1,))
    return device_ops.submit(op_type, name, buf, out.ctypes.data if out.size else 0, device=0, stream=0,
                             keepalive=(inp, out), value=out, **kw)


def reference(op, parts, prescale=1.0, postscale=1.0):
    wide = [p.astype(np.float64) for p in parts]
    if op == commlib.Sum or op == commlib.Average:
        acc = sum(wide) * prescale * postscale
        if op == commlib.Average:
            acc = acc / len(parts)
    elif op == commlib.Product:
        acc = np.prod(wide, axis=0)
    else:
        acc = (np.min if op == commlib.Min else np.max)(wide, axis=0)
    return acc.astype(parts[0].dtype)


def tolerance(dtype, opname):
    """Sums of small integers are exact; an Average over 3 ranks is not."""
    if opname != "Average" or n & (n - 1) == 0:
        return {}
    return {"rtol": {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6}.get(dtype.name, 1e-12)}


def same_everywhere(got, what):
    """got is bitwise the same on every rank."""
    raw = np.frombuffer(np.ascontiguousarray(got).tobytes(), np.uint8).reshape(1, -1)
    every = commlib.allgather(raw, name=f"bits.{what}")
    if not all(np.array_equal(every[q], every[0]) for q in range(n)):
        fail(f"{what}: results differ across ranks")


def check_allreduce(dtype, opname, salt, shape=(5, 3), **scale):
    op = OPS[opname]
    x = data(shape, dtype, salt)
    out = np.empty_like(x)
    got = synchronize(device(lib.COMMLIB_OP_ALLREDUCE, f"ar.{dtype}.{opname}.{salt}", x, out, reduce_op=op,
                             **scale))
    what = f"allreduce {dtype} {opname} {scale}"
    want = reference(op, [data(shape, dtype, salt, q) for q in range(n)], **scale)
    check_equal(got, want, what, **tolerance(dtype, opname))
    cpu = commlib.allreduce(x, op=op, name=f"cpu.{what}", prescale_factor=scale.get("prescale", 1.0),
                            postscale_factor=scale.get("postscale", 1.0))
    check_equal(got, cpu, what + " (CPU path)", **tolerance(dtype, opname))
    same_everywhere(got, what)
    check_equal(x, data(shape, dtype, salt), what + ": the input changed")


def test_allreduce():
    for dtype in FLOATS + INTS:
        ops = list(OPS) if dtype in FLOATS else ["Sum", "Min", "Max", "Product"]
        for opname in ops:
            check_allreduce(dtype, opname, 1)
    for dtype in FLOATS:
        check_allreduce(dtype, "Sum", 2, prescale=0.5, postscale=4.0)
        check_allreduce(dtype, "Average", 3, prescale=2.0, postscale=1.5)
    x = data((64,), np.float32, 4)  # in place
    want = reference(commlib.Sum, [data((64,), np.float32, 4, q) for q in range(n)])
    synchronize(device(lib.COMMLIB_OP_ALLREDUCE, "in-place", x, x, reduce_op=commlib.Sum))
    check_equal(x, want, "in-place allreduce")


def test_repeated_names():
    """A training loop's names repeat: the second sighting gives the request a
    response-cache bit (installed after the launch, which has already taken
    the request out of the pending ones), later ones run by that bit. Alone
    and several at once, with changing data. (The first GPU run failed here:
    "cache bit given to unknown request".)"""
    for step in range(6):
        for width in (1, 4):
            xs = [data((3, 2), np.float32, 300 + 10 * step + i) for i in range(width)]
            outs = [np.zeros_like(x) for x in xs]
            hs = [device(lib.COMMLIB_OP_ALLREDUCE, f"repeat.{width}.{i}", x, o, reduce_op=commlib.Sum)
                  for i, (x, o) in enumerate(zip(xs, outs))]
            for i, h in enumerate(hs):
                want = reference(commlib.Sum, [data((3, 2), np.float32, 300 + 10 * step + i, q) for q in range(n)])
                check_equal(synchronize(h), want, f"repeated allreduce {width}.{i} at step {step}")
        got = synchronize(device(lib.COMMLIB_OP_BROADCAST, "repeat.bc", data((4,), np.int64, step), np.zeros(4, np.int64),
                                 root=n - 1))
        check_equal(got, data((4,), np.int64, step, n - 1), f"repeated broadcast at step {step}")


def test_fusion():
    """Many small allreduces in flight at once are fused into the device buffer."""
    shapes = [(i % 7 + 1, 3) for i in range(40)]
    dtypes = [np.float32 if i % 3 else np.int64 for i in range(40)]
    xs = [data(s, d, 100 + i) for i, (s, d) in enumerate(zip(shapes, dtypes))]
    outs = [np.full_like(x, 99) for x in xs]
    hs = [device(lib.COMMLIB_OP_ALLREDUCE, f"fused.{i}", x, o, reduce_op=commlib.Sum)
          for i, (x, o) in enumerate(zip(xs, outs))]
    for i, h in enumerate(hs):
        want = reference(commlib.Sum, [data(shapes[i], dtypes[i], 100 + i, q) for q in range(n)])
        check_equal(synchronize(h), want, f"fused allreduce {i}")


def test_broadcast():
    for dtype in FLOATS + INTS:
        for root in {0, n - 1}:
            x = data((4, 2), dtype, 20 + root)
            out = np.zeros_like(x)
            got = synchronize(device(lib.COMMLIB_OP_BROADCAST, f"bc.{dtype}.{root}", x, out, root=root))
            check_equal(got, data((4, 2), dtype, 20 + root, root), f"broadcast {dtype} from {root}")


def test_allgather():
    for dtype in FLOATS + INTS:
        for uneven in (False, True):
            rows = [q + 1 if uneven else 2 for q in range(n)]
            x = data((rows[r], 3), dtype, 30)
            out = np.zeros((sum(rows), 3), dtype)
            got = synchronize(device(lib.COMMLIB_OP_ALLGATHER, f"ag.{dtype}.{uneven}", x, out,
                                     output_rows=sum(rows)))
            want = np.concatenate([data((rows[q], 3), dtype, 30, q) for q in range(n)])
            check_equal(got, want, f"allgather {dtype} uneven={uneven}")
            check_equal(got, commlib.allgather(x, name=f"cpu.ag.{dtype}.{uneven}"), "allgather (CPU path)")


def test_alltoall():
    def splits(src):
        return [(src + dst) % 3 for dst in range(n)]
    for dtype in (np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.uint8)):
        mine = splits(r)
        x = data((sum(mine), 2), dtype, 40)
        incoming = [splits(src)[r] for src in range(n)]
        out = np.zeros((sum(incoming), 2), dtype)
        got = synchronize(device(lib.COMMLIB_OP_ALLTOALL, f"a2a.{dtype}", x, out, splits=mine,
                                 output_rows=sum(incoming)))
        parts = []
        for src in range(n):
            theirs = data((sum(splits(src)), 2), dtype, 40, src)
            start = sum(splits(src)[:r])
            parts.append(theirs[start:start + splits(src)[r]])
        check_equal(got, np.concatenate(parts), f"alltoall {dtype}")


def test_reducescatter():
    for dtype in FLOATS + INTS:
        ops = ["Sum", "Average", "Max"] if dtype in FLOATS else ["Sum", "Min", "Product"]
        for dim0 in (2 * n, 2 * n + 1):
            for opname in ops:
                x = data((dim0, 3), dtype, 50)
                rows = reducescatter_rows(dim0)
                out = np.zeros((rows, 3), dtype)
                what = f"reducescatter {dtype} {opname} dim0={dim0}"
                got = synchronize(device(lib.COMMLIB_OP_REDUCESCATTER, what, x, out, reduce_op=OPS[opname]))
                cpu = commlib.reducescatter(x, op=OPS[opname], name="cpu." + what)
                check_equal(got, cpu, what + " (CPU path)", **tolerance(dtype, opname))
                whole = reference(OPS[opname], [data((dim0, 3), dtype, 50, q) for q in range(n)])
                start = _first_row(dim0)
                check_equal(got, whole[start:start + rows], what, **tolerance(dtype, opname))


def _first_row(dim0):
    rows = commlib.allgather(np.array([reducescatter_rows(dim0)]), name=f"rows.{dim0}")
    return int(rows[:r].sum())


def test_process_set():
    """A set of some ranks (one rank alone at 2 ranks) has its own communicator."""
    members = [0, n - 1] if n > 2 else [n - 1]
    ps = commlib.add_process_set(members)
    if r in members:
        x = data((6,), np.float32, 60)
        out = np.zeros_like(x)
        got = synchronize(device(lib.COMMLIB_OP_ALLREDUCE, "ps.ar", x, out, reduce_op=commlib.Sum,
                                 process_set=ps.process_set_id))
        check_equal(got, sum(data((6,), np.float32, 60, q) for q in members), "set allreduce")
    commlib.remove_process_set(ps)


def test_refusals():
    x = np.ones(4, np.int32)
    expect_raises(TypeError, lambda: device(lib.COMMLIB_OP_ALLREDUCE, "avg.int", x, np.empty_like(x),
                                            reduce_op=commlib.Average), "Average of int32 on NCCL",
                  match="floating-point")
    y = np.ones(4, np.float32)
    expect_raises(ValueError, lambda: device(lib.COMMLIB_OP_ALLREDUCE, "max.scaled", y, np.empty_like(y),
                                             reduce_op=commlib.Max, prescale=2.0), "scaled Max on NCCL",
                  match="prescale/postscale")
    z = np.ones(4, np.int16)
    expect_raises(TypeError, lambda: device(lib.COMMLIB_OP_ALLREDUCE, "int16", z, np.empty_like(z),
                                            reduce_op=commlib.Sum), "int16 on NCCL", match="NCCL cannot reduce")
    expect_raises(ValueError, lambda: device(lib.COMMLIB_OP_ALLREDUCE, "adasum", y, np.empty_like(y),
                                             reduce_op=commlib.Adasum), "Adasum on NCCL",
                  match="NCCL does not run Adasum")
    # the executor still runs afterwards
    check_allreduce(np.dtype(np.float32), "Sum", 70)


def test_ordering():
    """With every emulated stream task delayed, the input is produced on the
    caller's stream after submission returns; the result must still use it.
    The last rank's tasks also end 200 ms after their work (a kernel still
    finishing there): rank 0 is done first and shuts down right after the
    last collective, which the last rank must still complete, not fail."""
    delay = int(os.environ["COMMLIB_GPU_EMULATOR_DELAY_US"])
    if r == n - 1:
        os.environ["COMMLIB_GPU_EMULATOR_TAIL_US"] = "200000"  # (read when the emulator's streams start)
    for i in range(3):
        size = 1 << (10 + 4 * i)
        src = np.full(size, float(r + 1 + i), np.float32)  # what the "kernel" writes
        x = np.zeros(size, np.float32)                     # "device" input, stale until then
        out = np.full(size, -1.0, np.float32)
        for dst in (out, out, out, x):  # (a long "kernel": the input is ready after 4 delayed tasks)
            copy_on_stream(dst, src)
        start = time.monotonic()
        h = device(lib.COMMLIB_OP_ALLREDUCE, f"ordered.{i}", x, out, reduce_op=commlib.Sum)
        got = synchronize(h)
        if time.monotonic() - start < delay * 1e-6:
            fail("the handle completed before the emulated stream could have run the collective")
        want = np.full(size, float(sum(q + 1 + i for q in range(n))), np.float32)
        check_equal(got, want, f"allreduce after an asynchronous producer ({size} elements)")
    # (then done() and shutdown(): rank 0 leaves while the last rank's collective still runs)


def copy_on_stream(dst, src, stream=0):
    """An asynchronous copy on an emulated stream (a "kernel")."""
    rc = EMULATOR.cudaMemcpyAsync(ctypes.c_void_p(dst.ctypes.data), ctypes.c_void_p(src.ctypes.data),
                                  ctypes.c_size_t(dst.nbytes), 1, ctypes.c_void_p(stream))
    if rc != 0:
        fail(f"cudaMemcpyAsync: {rc}")


def test_stream_sync():
    """synchronize_on_stream returns once the collective is launched, before
    the device has run it (its input is not even ready yet), and work queued
    on the caller's stream afterwards sees the result."""
    for i in range(3):
        size = 1 << (10 + 4 * i)
        src = np.full(size, float(r + 1 + i), np.float32)
        x = np.zeros(size, np.float32)
        out = np.full(size, -1.0, np.float32)
        for _ in range(16):  # (a long "kernel": the input is ready after 17 delayed tasks, 510 ms)
            copy_on_stream(out[:1], src[:1])
        copy_on_stream(x, src)
        got = synchronize_on_stream(device(lib.COMMLIB_OP_ALLREDUCE, f"on-stream.{i}", x, out,
                                           reduce_op=commlib.Sum), 0)
        if got is not out:
            fail("synchronize_on_stream did not return the output")
        if out[1] != -1.0:
            fail("synchronize_on_stream waited for the device to finish the collective")
        probe = np.zeros_like(out)
        copy_on_stream(probe, out)  # queued after the synchronize: must see the result
        EMULATOR.cudaStreamSynchronize(ctypes.c_void_p(0))
        want = np.full(size, float(sum(q + 1 + i for q in range(n))), np.float32)
        check_equal(probe, want, f"the caller's stream after synchronize_on_stream ({size} elements)")
    # A training loop submits the same name again as soon as synchronize
    # returned, while the device still runs the first (found on the first GPU
    # run: "already in flight"); the device runs them in order.
    xs = [np.full(1 << 12, float(r + k), np.float32) for k in range(3)]
    outs = [np.full(1 << 12, -1.0, np.float32) for _ in xs]
    for k in range(3):
        for _ in range(4):  # (a long "kernel" before each)
            copy_on_stream(outs[k][:1], xs[k][:1])
        synchronize_on_stream(device(lib.COMMLIB_OP_ALLREDUCE, "on-stream.again", xs[k], outs[k],
                                     reduce_op=commlib.Sum), 0)
    if outs[2][1] != -1.0:
        fail("synchronize_on_stream waited for the device (the repeated name's case proves nothing)")
    EMULATOR.cudaStreamSynchronize(ctypes.c_void_p(0))
    for k in range(3):
        check_equal(outs[k], np.full(1 << 12, float(sum(q + k for q in range(n))), np.float32),
                    f"the repeated name's collective {k}")
    # A CPU handle is synchronized as by synchronize.
    h = commlib.allreduce_async(np.ones(3), op=commlib.Sum, name="cpu.on-stream")
    check_equal(synchronize_on_stream(h, 0), np.full(3, float(n)), "a CPU handle through synchronize_on_stream")


def test_stopped(how):
    """The last rank stops taking part: it never submits (sleeps), or it is
    stopped (SIGSTOP) inside the collective (frozen). The others fail with
    CollectiveTimeoutError naming it within the timeout + 10 s; then every
    rank goes on (a new communicator replaces the aborted one). With
    frozen-on-stream the others synchronize on their stream: that returns at
    once, their stream waits until the communicator is aborted, and the
    timeout error comes from their next synchronize."""
    timeout = float(os.environ["COMMLIB_TIMEOUT"])
    on_stream = how == "frozen-on-stream"
    pids = commlib.allgather(np.array([os.getpid()]), name="pids")
    x = np.ones(1 << 16, np.float32)
    synchronize(device(lib.COMMLIB_OP_ALLREDUCE, "warm-up", x, x, reduce_op=commlib.Sum))
    last = r == n - 1
    if last and how == "sleeps":
        time.sleep(timeout + 3)  # (never submits 'stuck')
    elif last:
        h = device(lib.COMMLIB_OP_ALLREDUCE, "stuck", x, x, reduce_op=commlib.Sum)
        commlib.barrier()
        time.sleep(1)  # (stopped in here by rank 0, and resumed after the others failed)
        # Its own collective fails too: its peers aborted, and it has made no
        # progress for longer than the timeout.
        expect_raises(commlib.CommlibError, lambda: synchronize(h), "the stopped rank's collective")
        if on_stream:
            commlib.barrier()
    else:
        if how != "sleeps":
            commlib.barrier()
            if r == 0:
                stop_process(int(pids[n - 1]))
        start = time.monotonic()
        stuck = device(lib.COMMLIB_OP_ALLREDUCE, "stuck", x, x, reduce_op=commlib.Sum)
        if on_stream:
            synchronize_on_stream(stuck, 0)
            EMULATOR.cudaStreamSynchronize(ctypes.c_void_p(0))  # (ends when the communicator is aborted)
            time.sleep(0.5)
            if r == 0:
                os.kill(int(pids[n - 1]), signal.SIGCONT)
            e = expect_raises(commlib.CollectiveTimeoutError, commlib.barrier,
                              "the synchronize after a collective that failed on the device")
            if "after synchronize() had returned" not in str(e):
                fail(f"the error does not say the collective failed after its synchronize: {e}")
        else:
            e = expect_raises(commlib.CollectiveTimeoutError, lambda: synchronize(stuck),
                              f"allreduce with rank {n - 1} stopped")
        took = time.monotonic() - start
        if took > timeout + 10:
            fail(f"the timeout error took {took:.1f} s (COMMLIB_TIMEOUT {timeout:.0f} s)")
        for part in ("'stuck'", str(n - 1)) + (("ncclCommAbort",) if how != "sleeps" else ()):
            if part not in str(e):
                fail(f"the error does not name {part}: {e}")
        if r == 0 and how == "frozen":
            os.kill(int(pids[n - 1]), signal.SIGCONT)
        print(f"rank {r}: {how}: {e}", flush=True)
    y = np.full(1000, float(r), np.float32)
    got = synchronize(device(lib.COMMLIB_OP_ALLREDUCE, "works", y, y, reduce_op=commlib.Sum))
    check_equal(got, np.full(1000, float(sum(range(n))), np.float32), "an allreduce after the timeout")


def test_join():
    """The last rank joins at once (naming device 0, where it never ran a CUDA
    collective); the others' CUDA collectives go on with it standing in on
    its device, as on the CPU path: zeros into allreduce (Average still
    divides by every rank) and reducescatter, no rows into allgather and
    alltoall, a broadcast received; fused small allreduces too. Then a second
    round where the joined rank stands in on its own device, after running
    CUDA collectives itself."""
    joined = n - 1
    active = list(range(n - 1))
    for rnd in range(2):
        if rnd == 1:  # every rank ran a CUDA collective (device 0) before this round's join
            check_allreduce(np.dtype(np.float32), "Sum", 90)
        if r == joined:
            last = commlib.join(device=0)
        else:
            x = data((5, 3), np.float32, 80 + rnd)
            for opname in ("Sum", "Average", "Max"):
                got = synchronize(device(lib.COMMLIB_OP_ALLREDUCE, f"j.ar.{opname}", x, np.empty_like(x),
                                         reduce_op=OPS[opname]))
                parts = [data((5, 3), np.float32, 80 + rnd, q) for q in active] + [np.zeros((5, 3), np.float32)]
                want = reference(OPS[opname], parts)
                if opname == "Average":
                    want = (sum(p.astype(np.float64) for p in parts) / n).astype(np.float32)
                check_equal(got, want, f"allreduce {opname} with rank {joined} joined", rtol=1e-6)
            hs = [device(lib.COMMLIB_OP_ALLREDUCE, f"j.fused.{i}", data((i + 1,), np.int64, 85 + i),
                         np.zeros(i + 1, np.int64), reduce_op=commlib.Sum) for i in range(12)]
            for i, h in enumerate(hs):
                check_equal(synchronize(h), sum(data((i + 1,), np.int64, 85 + i, q) for q in active),
                            f"fused allreduce {i} with rank {joined} joined")
            rows = [q + 1 for q in active]
            g = data((rows[r], 2), np.int32, 86)
            got = synchronize(device(lib.COMMLIB_OP_ALLGATHER, "j.ag", g, np.zeros((sum(rows), 2), np.int32),
                                     output_rows=sum(rows)))
            check_equal(got, np.concatenate([data((rows[q], 2), np.int32, 86, q) for q in active]),
                        "allgather with a joined rank")
            b = data((4,), np.float64, 87)
            got = synchronize(device(lib.COMMLIB_OP_BROADCAST, "j.bc", b, np.zeros_like(b), root=0))
            check_equal(got, data((4,), np.float64, 87, 0), "broadcast with a joined rank")
            dim0 = 2 * n + 1
            rs = data((dim0, 3), np.float32, 88)
            mine = reducescatter_rows(dim0)
            got = synchronize(device(lib.COMMLIB_OP_REDUCESCATTER, "j.rs", rs, np.zeros((mine, 3), np.float32),
                                     reduce_op=commlib.Sum))
            whole = sum(data((dim0, 3), np.float32, 88, q) for q in active)
            start = sum(dim0 // n + (1 if q < dim0 % n else 0) for q in range(r))
            check_equal(got, whole[start:start + mine], "reducescatter with a joined rank")
            splits = [(r + dst) % 3 + 1 for dst in range(n)]
            a = data((sum(splits), 2), np.float32, 89)
            incoming = [(src + r) % 3 + 1 for src in active]
            got = synchronize(device(lib.COMMLIB_OP_ALLTOALL, "j.a2a", a, np.zeros((sum(incoming), 2), np.float32),
                                     splits=splits, output_rows=sum(incoming)))
            parts = []
            for src in active:
                theirs_splits = [(src + dst) % 3 + 1 for dst in range(n)]
                theirs = data((sum(theirs_splits), 2), np.float32, 89, src)
                start = sum(theirs_splits[:r])
                parts.append(theirs[start:start + theirs_splits[r]])
            check_equal(got, np.concatenate(parts), "alltoall with a joined rank")
            last = commlib.join()
        lasts = commlib.allgather(np.array([last]), name=f"j.last.{rnd}")
        if len(set(lasts.tolist())) != 1 or lasts[0] not in active:
            fail(f"join returned {lasts.tolist()}: expected one of the ranks {active}, the same everywhere")
    print(f"rank {r}: join with CUDA collectives: ok", flush=True)


def test_init_hangs():
    """The last rank never joins ncclCommInitRank (the emulator's
    COMMLIB_GPU_EMULATOR_INIT_HANG_RANK): every rank's first CUDA collective,
    which creates the communicator, fails with CollectiveTimeoutError naming
    ncclCommInitRank within the timeout + 10 s, instead of waiting forever;
    CPU collectives go on. Meanwhile commlib.engine_state(), read from
    another thread, names the step the engine is stuck in."""
    import threading

    timeout = float(os.environ["COMMLIB_TIMEOUT"])
    x = np.ones(64, np.float32)
    commlib.barrier()
    states = []
    watcher = threading.Timer(timeout / 2, lambda: states.append(commlib.engine_state()))
    watcher.start()
    start = time.monotonic()
    e = expect_raises(commlib.CollectiveTimeoutError,
                      lambda: synchronize(device(lib.COMMLIB_OP_ALLREDUCE, "first", x, x, reduce_op=commlib.Sum)),
                      "a CUDA allreduce whose communicator cannot be created")
    took = time.monotonic() - start
    if took > timeout + 10:
        fail(f"the timeout error took {took:.1f} s (COMMLIB_TIMEOUT {timeout:.0f} s)")
    for part in ("ncclCommInitRank", "'first'", "COMMLIB_TIMEOUT"):
        if part not in str(e):
            fail(f"the error does not name {part}: {e}")
    watcher.join()
    want = ("one engine cycle has run for", "allreduce 'first'", "creating an NCCL communicator", "ncclCommInitRank")
    if not states or not all(part in states[0] for part in want):
        fail(f"the engine state during the hang does not name {want}: {states}")
    print(f"rank {r}: init-hang after {took:.1f} s: {e}", flush=True)
    got = commlib.allreduce(np.full(3, float(r)), op=commlib.Sum, name="cpu.after")
    check_equal(got, np.full(3, float(sum(range(n)))), "a CPU allreduce after the failed creation")


if case == "collectives":
    for test in (test_allreduce, test_repeated_names, test_fusion, test_broadcast, test_allgather, test_alltoall, test_reducescatter,
                 test_process_set, test_refusals):
        test()
elif case == "ordering":
    test_ordering()
elif case == "stream":
    test_stream_sync()
elif case in ("sleeps", "frozen", "frozen-on-stream"):
    test_stopped(case)
elif case == "init-hang":
    test_init_hangs()
elif case == "join":
    test_join()
else:
    fail(f"unknown case {case}")
done()
commlib.shutdown()

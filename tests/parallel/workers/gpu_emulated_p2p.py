"""Run by tests/parallel/test_gpu_emulated_p2p.py: point-to-point between
device buffers through the core's NCCL links (csrc/p2p/nccl_links.cc), on
CPU against the GPU emulator (tests/gpu_emulator/): "device" buffers are
numpy arrays, stream 0 is the emulator's legacy default
stream. Every received message is checked against what its sender made.

argv[1]:
- exchange: a ring of every dtype and several sizes, each rank sending to the
  next and receiving from the previous at once (at 2 ranks both directions of
  a pair at once), into device memory of the right size and into the core's
  (copied out with release); messages to the rank itself; sends synchronized before the receives (both
  ends progress in the background); tags synchronized out of their sending
  order; one tag's messages in order; host messages into receives that take
  device messages; the refusals (a device message into a plain receive, a
  receive of the wrong size) on both ends;
- ordering (run with COMMLIB_GPU_EMULATOR_DELAY_US): the sender's data is
  written by an asynchronous copy on its stream just before the send is
  submitted; the receiver must get it;
- frozen (run with COMMLIB_TIMEOUT): the last rank is stopped (SIGSTOP) after
  posting a send to rank 0, which then receives it: rank 0's
  receive fails with CollectiveTimeoutError naming the last rank within the
  timeout + 10 s; resumed, the last rank's send ends (failed, its link having
  been aborted by rank 0, or complete), and a new message between them goes
  through.
"""
import ctypes
import os
import sys
import time

import numpy as np

import commlib
from commlib import device_p2p
from commlib.dtypes import dtype_code, numpy_dtype
from commlib.handle import synchronize
from _common import check_equal, done, expect_raises, fail, stop_process

try:
    import ml_dtypes
    BF16 = [np.dtype(ml_dtypes.bfloat16)]
except ImportError:
    BF16 = []

commlib.init()
r, n = commlib.rank(), commlib.size()
case = sys.argv[1]
EMULATOR = ctypes.CDLL(os.environ["COMMLIB_NCCL_LIBRARY"])
DTYPES = [np.dtype(t) for t in (np.float32, np.float16, np.float64, np.int32, np.int64, np.uint8, np.int8,
                                np.int16, np.bool_)] + BF16


def data(shape, dtype, salt, rank):
    g = np.random.default_rng(1000 * salt + rank)
    return g.integers(0, 2 if dtype == np.bool_ else 100, size=shape).astype(dtype)


def dsend(arr, dst, tag):
    return device_p2p.isend_device(arr.ctypes.data if arr.size else 0, dtype_code(arr.dtype), arr.shape, dst, tag,
                                   device=0, stream=0, keepalive=arr)


def drecv(src, tag, **kw):
    return device_p2p.irecv_device(src, tag, device=0, stream=0, **kw)


def copy_out(got):
    """A message in the core's "device" memory, copied into a new array (and freed)."""
    if isinstance(got, np.ndarray) and got.size == 0:
        return got  # (a message of no bytes: nothing moved)
    if not isinstance(got, device_p2p.DeviceMessage):
        fail(f"a device message arrived as {type(got).__name__}, not in the core's device memory")
    out = np.full(got.shape, 7, numpy_dtype(got.dtype))
    device_p2p.release(got, out.ctypes.data if out.size else 0, stream=0)
    EMULATOR.cudaStreamSynchronize(ctypes.c_void_p(0))  # (the copy runs on stream 0)
    return out


def take(src, tag):
    return copy_out(synchronize(drecv(src, tag)))


def take_into(src, tag, shape, dtype):
    """A receive into "device" memory of the message's size."""
    out = np.full(shape, 7, dtype)
    got = synchronize(drecv(src, tag, device_out=out.ctypes.data, dtype=dtype_code(out.dtype), shape=out.shape,
                            keepalive=out))
    if got is not None:
        fail(f"a device message into device_out returned {type(got).__name__}")
    return out


def test_ring():
    nxt, prv = (r + 1) % n, (r - 1) % n
    for salt, dtype in enumerate(DTYPES):
        for shape in ((5, 3), (), (0,), (1 << 20,)):
            mine = data(shape, dtype, salt, r)
            s = dsend(mine, nxt, tag=salt)
            if salt % 2 and int(np.prod(shape)):
                got = take_into(prv, salt, shape, dtype)
            else:
                got = take(prv, salt)
            synchronize(s)
            check_equal(got, data(shape, dtype, salt, prv), f"{dtype} {shape} from rank {prv}")
    # To itself: one copy on the device (no NCCL communicator), both landing places.
    for i, shape in enumerate(((6,), (1 << 16,))):
        mine = data(shape, np.float32, 50 + i, r)
        s = dsend(mine, r, tag=60 + i)
        got = take_into(r, 60 + i, shape, np.float32) if i else take(r, 60 + i)
        synchronize(s)
        check_equal(got, mine, f"a device message to itself {shape}")
    # Sends synchronized first: the receives move their data in the background.
    for size in (10, 1 << 18):
        s = dsend(np.full(size, r, np.int32), nxt, tag=90)
        h = drecv(prv, 90)
        synchronize(s)
        check_equal(copy_out(synchronize(h)), np.full(size, prv, np.int32), f"a send synchronized first ({size})")


def test_tag_order():
    """Rank 0 sends tags 1, 2, 3 (and four messages of tag 4) to rank 1,
    which posts receives for 3, 1, 2 and synchronizes them as 2, 3, 1."""
    if r == 0:
        hs = [dsend(np.full(10 * t, t, np.int64), 1, t) for t in (1, 2, 3)]
        hs += [dsend(np.full(8, 40 + i, np.float32), 1, 4) for i in range(4)]
        for h in hs:
            synchronize(h)
    elif r == 1:
        posted = {t: drecv(0, t) for t in (3, 1, 2)}
        for t in (2, 3, 1):
            check_equal(copy_out(synchronize(posted[t])), np.full(10 * t, t, np.int64), f"tag {t} out of order")
        for i in range(4):
            check_equal(take_into(0, 4, (8,), np.float32), np.full(8, 40 + i, np.float32), f"message {i} of tag 4")


def test_host_and_refusals():
    if r == 0:
        commlib.send(np.arange(6.0), 1, tag=20)  # a host message into a receive that takes device messages
        commlib.send(np.arange(4, dtype=np.int32), 1, tag=21)
        commlib.send(np.arange(5), 1, tag=24)
        e = expect_raises(ValueError, lambda: synchronize(dsend(np.ones(3, np.float32), 1, 22)),
                          "a device message into a plain receive (sender)")
        if "GPU memory" not in str(e):
            fail(f"the sender's error does not say why: {e}")
        e = expect_raises(ValueError, lambda: synchronize(dsend(np.ones(4, np.float32), 1, 23)),
                          "a device message of the wrong size (sender)")
        if "float32 [4]" not in str(e) and "[4]" not in str(e):
            fail(f"the sender's error does not name the message: {e}")
    elif r == 1:
        got = synchronize(drecv(0, 20))
        check_equal(got, np.arange(6.0), "a host message into a receive that takes device messages")
        out = np.zeros(4, np.int32)
        got = synchronize(drecv(0, 21, host_out=out))
        if got is not out:
            fail("a receive with host_out did not return it")
        check_equal(out, np.arange(4, dtype=np.int32), "a host message into host_out")
        dev = np.zeros(5, np.int64)
        got = synchronize(drecv(0, 24, device_out=dev.ctypes.data, dtype=dtype_code(dev.dtype), shape=dev.shape))
        check_equal(got, np.arange(5), "a host message into a receive with device_out (in host memory)")
        e = expect_raises(ValueError, lambda: commlib.recv(0, tag=22), "a device message into a plain receive")
        if "COMMLIB_GPU_BACKEND=host" not in str(e):
            fail(f"the receiver's error does not say what to do: {e}")
        expect_raises(ValueError, lambda: synchronize(drecv(0, 23, dtype=dtype_code(np.float32), shape=(3,))),
                      "a receive of the wrong size")
    commlib.barrier()


def copy_on_stream(dst, src):
    rc = EMULATOR.cudaMemcpyAsync(ctypes.c_void_p(dst.ctypes.data), ctypes.c_void_p(src.ctypes.data),
                                  ctypes.c_size_t(dst.nbytes), 1, ctypes.c_void_p(0))
    if rc != 0:
        fail(f"cudaMemcpyAsync: {rc}")


def test_ordering():
    """The send waits on the device for what the caller's stream queued before it."""
    nxt, prv = (r + 1) % n, (r - 1) % n
    for i in range(3):
        size = 1 << (10 + 4 * i)
        x = np.zeros(size, np.float32)
        src = np.full(size, float(r + 1 + i), np.float32)  # (what the "kernel" writes)
        for _ in range(3):
            copy_on_stream(x, src)  # (x is ready after 3 delayed tasks)
        s = dsend(x, nxt, i)
        got = take(prv, i)
        synchronize(s)
        check_equal(got, np.full(size, float(prv + 1 + i), np.float32), f"a message written on the stream ({size})")


def test_frozen():
    timeout = float(os.environ["COMMLIB_TIMEOUT"])
    last = n - 1
    pids = commlib.allgather(np.array([os.getpid()]), name="pids")
    x = np.arange(1 << 12, dtype=np.float32)
    if r == last:
        synchronize(dsend(x, 0, 1))  # (the link from the last rank to rank 0 exists from here on)
        h = dsend(x + 1, 0, 2)
        commlib.barrier()
        time.sleep(1)  # (stopped here by rank 0, resumed after its receive failed)
        # Its send ends, failed (its link sees the partner's abort) or complete
        # (NCCL may complete a send whose data it took in; under load the
        # emulator did so about once in twelve runs): either way it does not hang.
        try:
            synchronize(h)
            print(f"rank {r}: the stopped rank's send completed", flush=True)
        except commlib.CommlibError as e:
            print(f"rank {r}: the stopped rank's send: {e}", flush=True)
        synchronize(dsend(x + 3, 0, 3))
    elif r == 0:
        check_equal(take(last, 1), x, "the first message")
        commlib.barrier()
        stop_process(int(pids[last]))
        start = time.monotonic()
        e = expect_raises(commlib.CollectiveTimeoutError, lambda: take(last, 2),
                          f"a receive from the stopped rank {last}")  # (its header came before the stop)
        took = time.monotonic() - start
        os.kill(int(pids[last]), 18)  # SIGCONT
        if took > timeout + 10:
            fail(f"the timeout error took {took:.1f} s (COMMLIB_TIMEOUT {timeout:.0f} s)")
        for part in (f"rank {last}", "COMMLIB_TIMEOUT", "aborted"):
            if part not in str(e):
                fail(f"the error does not name {part}: {e}")
        print(f"rank 0: the receive from the stopped rank: {e}", flush=True)
        check_equal(take(last, 3), x + 3, "a message after the timeout (a new link)")
    else:
        commlib.barrier()
        time.sleep(timeout + 3)  # (so that its last barrier does not time out while rank 0 waits out its receive)
    commlib.barrier()


if case == "exchange":
    test_ring()
    test_tag_order()
    test_host_and_refusals()
elif case == "ordering":
    test_ordering()
elif case == "frozen":
    test_frozen()
else:
    fail(f"unknown case {case}")
done()
commlib.shutdown()

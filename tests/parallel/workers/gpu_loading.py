"""NCCL loaded at run time on CPU-only ranks: the unique id made on a set's
rank 0 reaches every member byte for byte, and a CUDA request that cannot run
(no CUDA runtime, no NCCL, COMMLIB_GPU_BACKEND=host) is refused on every rank
with its reason, after which the job goes on. argv[1]: ids | refuse."""
import sys

import numpy as np

import commlib
import commlib.gpu
from commlib import device_ops
from commlib._lib import lib
from _common import check_equal, done, expect_raises, fail

commlib.init()
rank, size = commlib.rank(), commlib.size()
mode = sys.argv[1]
status = commlib.gpu.load()


def gathered_ids(process_set=0):
    mine = np.frombuffer(commlib.gpu.unique_id(process_set), dtype=np.uint8)
    return mine, commlib.allgather(mine[None, :], name=f"ids.{process_set}.{mine[:8].tobytes().hex()}")


if mode == "ids":
    if not status.nccl.usable:
        fail(f"NCCL should load here: {status.nccl.error}")
    first, rows = gathered_ids()
    for r in range(size):
        check_equal(rows[r], rows[0], f"unique id of rank {r} vs rank 0")
    if not first.any():
        fail("the unique id is all zeros")
    second, rows2 = gathered_ids()
    if np.array_equal(second, first):
        fail("two unique ids in a row are equal")
    check_equal(rows2[size - 1], rows2[0], "second id, last rank vs rank 0")
    if size >= 3:  # a process set of the even ranks gets its own id
        evens = commlib.add_process_set(list(range(0, size, 2)))
        if rank % 2 == 0:
            mine = np.frombuffer(commlib.gpu.unique_id(evens.process_set_id), dtype=np.uint8)
        else:
            mine = np.zeros(128, dtype=np.uint8)
        rows3 = commlib.allgather(mine[None, :], name="ids.set")
        check_equal(rows3[2], rows3[0], "set id, rank 2 vs rank 0")
        if np.array_equal(rows3[0], second) or not rows3[0].any():
            fail("the set's id is not a fresh id")
elif mode == "refuse":
    expected = sys.argv[2]
    buf = device_ops.DeviceBuffer(ptr=0x1000, dtype=lib.COMMLIB_FLOAT32, shape=(4,))
    for op in (lib.COMMLIB_OP_ALLREDUCE, lib.COMMLIB_OP_BROADCAST):
        expect_raises(ValueError, lambda: device_ops.submit(op, f"cuda.{op}", buf, 0x2000, device=0, stream=0),
                      f"CUDA request op {op}", match=expected)
    # the job goes on: a host allreduce right after
    out = commlib.allreduce(np.full(3, rank + 1.0), op=commlib.Sum, name="after")
    check_equal(out, np.full(3, size * (size + 1) / 2), "allreduce after the refusal")
else:
    fail(f"unknown mode {mode}")
done()
commlib.shutdown()

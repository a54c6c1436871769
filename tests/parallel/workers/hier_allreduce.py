"""Allreduce across (simulated) hosts: with COMMLIB_TEST_RANKS_PER_HOST=k the
core treats every k consecutive ranks as one host, so the hierarchical path
(reduce within the host through shared memory, all-reduce each slice across
hosts, share within the host) runs on one machine. Checks topology, exact
integer results, float results against numpy and bitwise equality across
ranks, for single tensors (pipelined path) and groups (fused path)."""
import os
import sys

import numpy as np
from mpi4py import MPI

import commlib
from _common import check_equal, done, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
k = int(os.environ["COMMLIB_TEST_RANKS_PER_HOST"])
hosts = [list(range(h, min(h + k, n))) for h in range(0, n, k)]
my_host = r // k
check_equal(commlib.local_size(), len(hosts[my_host]), "local_size")
check_equal(commlib.local_rank(), r - my_host * k, "local_rank")
check_equal(commlib.cross_rank(), my_host, "cross_rank")
expected_cross = len(hosts) if r % k < len(hosts[-1]) or len(hosts[-1]) == k else len(hosts) - 1
check_equal(commlib.cross_size(), expected_cross, "cross_size")


def data(rank, count, dtype):
    return np.random.default_rng(1000 * rank + count).integers(-50, 50, count).astype(dtype)


comm = MPI.COMM_WORLD
for count in [0, 1, n - 1, n + 1, 1000, 65536 * 3 + 7, 2_000_003]:
    for dtype in (np.int64, np.float32):
        got = commlib.allreduce(data(r, count, dtype), op=commlib.Sum, name=f"s.{count}.{dtype.__name__}")
        want = sum(data(q, count, np.float64) for q in range(n)).astype(dtype) if count else np.zeros(0, dtype)
        check_equal(got, want, f"sum of {count} {dtype.__name__}", rtol=1e-6 if dtype == np.float32 else 0)
        if len(set(comm.allgather(got.tobytes()))) != 1:
            fail(f"results of {count} {dtype.__name__} differ across ranks")
    got = commlib.allreduce(data(r, count, np.int32), op=commlib.Max, name=f"m.{count}")
    want = np.max([data(q, count, np.int32) for q in range(n)], axis=0) if count else np.zeros(0, np.int32)
    check_equal(got, want, f"max of {count}")

group = [np.full(5, r, np.float32), np.full(9, r + 1, np.float16), np.arange(700, dtype=np.int64) * r]
got = commlib.grouped_allreduce(group, op=commlib.Sum, name="grp")
check_equal(got[0], np.full(5, n * (n - 1) / 2, np.float32), "group float32")
check_equal(got[1], np.full(9, n * (n + 1) / 2, np.float16), "group float16")
check_equal(got[2], np.arange(700, dtype=np.int64) * (n * (n - 1) // 2), "group int64")
avg = commlib.allreduce(np.full(10, float(r)), op=commlib.Average, name="avg")
check_equal(avg, np.full(10, (n - 1) / 2), "average", rtol=1e-12)
# Large enough for the ring across hosts, which scales as it reduces; and a
# postscale on top of Average.
for count, post in [(1_000_003, 1.0), (300_001, 0.25)]:
    mine = data(r, count, np.float32)
    got = commlib.allreduce(mine, op=commlib.Average, postscale_factor=post, name=f"avg.{count}")
    check_equal(mine, data(r, count, np.float32), f"average of {count}: input unchanged")
    want = (sum(data(q, count, np.float64) for q in range(n)) / n * post).astype(np.float32)
    check_equal(got, want, f"average of {count} x {post}", rtol=1e-6, atol=1e-6)
    if len(set(comm.allgather(got.tobytes()))) != 1:
        fail(f"averages of {count} differ across ranks")
# float16 crosses hosts as float16: each host's float32 sum is rounded to
# float16 before the inter-host step (half the bytes). 1.0 on rank 0 and
# 2^-11 (half of float16's spacing at 1.0) elsewhere: on one host, rounded
# once, the sum of four is 1 + 3 2^-11, a tie that rounds to 1 + 2^-9; two
# hosts of two round host 0's 1 + 2^-11 to 1.0 first, and add host 1's 2^-10.
if n == 4:
    tiny = np.full(4099, 2.0 ** -11, np.float16)
    for count, kind in [(4099, "fused"), (3_000_001, "pipelined")]:
        mine = np.ones(count, np.float16) if r == 0 else np.resize(tiny, count)
        got = commlib.allreduce(mine, op=commlib.Sum, name=f"f16.{count}")
        if len(set(comm.allgather(got.tobytes()))) != 1:
            fail(f"float16 sums of {count} differ across ranks")
        if k == 2:
            check_equal(got, np.full(count, 1.0 + 2.0 ** -10, np.float16),
                        f"float16 across two hosts of two ({kind})")
        elif k == 4:
            check_equal(got, np.full(count, 1.0 + 2.0 ** -9, np.float16),
                        f"float16 on one host ({kind})")
done()
sys.exit(0)

"""The hierarchical allreduce across two real hosts (network namespaces, see
tests/parallel/netns_hosts.py): 2 ranks per host. Checks that each rank sees
its own host (host name, local/cross topology), exact and float results
against numpy on every rank, bitwise-equal results across ranks, and that
the hierarchical path ran: the bytes that crossed this host's link during
K allreduces of N bytes are ~K*N each way, where any flat algorithm over the
four ranks moves at least 1.5*K*N (a ring 0-1-2-3 crosses the link twice per
direction with 3/4 of the data each time). argv: the expected host names."""
import socket
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

import commlib
from _common import check_equal, done, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
hosts = sys.argv[1:]
check_equal(n, 4, "ranks")
check_equal(socket.gethostname(), hosts[r // 2], "host name")
check_equal(commlib.local_size(), 2, "local_size")
check_equal(commlib.local_rank(), r % 2, "local_rank")
check_equal(commlib.cross_size(), 2, "cross_size")
check_equal(commlib.cross_rank(), r // 2, "cross_rank")
comm = MPI.COMM_WORLD


def data(rank, count, dtype):
    return np.random.default_rng(1000 * rank + count).integers(-50, 50, count).astype(dtype)


for count in [1, 3, 1000, 65536 * 3 + 7, 1_000_003]:
    for dtype in (np.int64, np.float32):
        got = commlib.allreduce(data(r, count, dtype), op=commlib.Sum, name=f"s.{count}.{dtype.__name__}")
        want = sum(data(q, count, np.float64) for q in range(n)).astype(dtype)
        check_equal(got, want, f"sum of {count} {dtype.__name__}", rtol=1e-6 if dtype == np.float32 else 0)
        if len(set(comm.allgather(got.tobytes()))) != 1:
            fail(f"results of {count} {dtype.__name__} differ across ranks")
group = [np.full(5, r, np.float32), np.arange(700, dtype=np.int64) * r]
got = commlib.grouped_allreduce(group, op=commlib.Sum, name="grp")
check_equal(got[0], np.full(5, 6.0, np.float32), "group float32")
check_equal(got[1], np.arange(700, dtype=np.int64) * 6, "group int64")


def link_bytes():
    """(sent, received) over this host's one non-loopback interface."""
    nets = [d for d in Path("/sys/class/net").iterdir() if d.name != "lo"]
    if len(nets) != 1:
        fail(f"expected one network interface besides lo, found {[d.name for d in nets]}")
    st = nets[0] / "statistics"
    return int((st / "tx_bytes").read_text()), int((st / "rx_bytes").read_text())


K, COUNT = 4, 2 << 20  # four allreduces of 8 MiB (float32)
big = np.full(COUNT, float(r), np.float32)
commlib.barrier()
before = link_bytes()
for k in range(K):
    got = commlib.allreduce(big, op=commlib.Sum, name="big")
check_equal(got, np.full(COUNT, 6.0, np.float32), "big sum")
commlib.barrier()
after = link_bytes()
if r % 2 == 0:  # one rank per host reports its host's link
    ratios = [(a - b) / (K * COUNT * 4) for a, b in zip(after, before)]
    print(f"rank {r}: link bytes / (K*N): sent {ratios[0]:.3f}, received {ratios[1]:.3f}", flush=True)
    for what, q in zip(("sent", "received"), ratios):
        if not 0.95 <= q <= 1.25:
            fail(f"{what} {q:.3f} x K*N over the link: the hierarchical path moves ~1.0 (flat ones >= 1.5)")
done()

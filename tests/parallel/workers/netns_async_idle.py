"""An allreduce across two hosts joined by a slow link (network namespaces,
see tests/parallel/netns_hosts.py; 1 rank per host) leaves the cores to the
training: after their spin budgets the threads in it nap between MPI
progress calls instead of yielding through the whole transfer. Each rank
first polls the handle from a sleeping main thread (the background thread
runs the allreduce, nobody waits), then waits for it in synchronize (the
waiting thread runs it itself), and prints the wall time and its process's
CPU time over each transfer; the test checks the ratio. Results are checked
against numpy on every rank."""
import time

import numpy as np

import commlib
from _common import check_equal, done

commlib.init()
r, n = commlib.rank(), commlib.size()
check_equal(n, 2, "ranks")
check_equal(commlib.cross_size(), 2, "cross_size (one rank per host)")

count = 4 << 20  # 16 MiB of float32: each rank sends 16 MiB over the ring
commlib.allreduce(np.ones(1000, np.float32), name="warm-up")  # (connections made, caches warm)
for how in ("polled", "waited"):
    for rep in range(2):
        x = np.full(count, float(r + 1), np.float32)
        x[::7] += np.arange(len(x[::7]), dtype=np.float32) % 13
        commlib.barrier()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        h = commlib.allreduce_async(x, name=f"big.{how}.{rep}", op=commlib.Average)
        if how == "polled":
            while not commlib.poll(h):
                time.sleep(0.02)
        got = commlib.synchronize(h)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        want = np.full(count, (1.0 + 2.0) / 2, np.float32)
        want[::7] += np.arange(len(want[::7]), dtype=np.float32) % 13
        check_equal(got, want, f"average {how} {rep}")
        print(f"rank {r}: {how} transfer {rep}: wall {wall:.3f} s, cpu {cpu:.3f} s", flush=True)
done()

"""How the bench times calls: each call alone, or several cases taking
turns round by round (the slowest rank's median)."""
from __future__ import annotations

import statistics
import time


def time_calls(fn, iters: int, comm, aligned: bool = False) -> list[float]:
    """Seconds of each of iters calls of fn. aligned: the ranks line up (an
    MPI barrier, not timed) before every call, so that each time is one
    call's latency (as OSU's benchmarks time a broadcast) rather than the
    pace of back-to-back calls, which a root that need not wait runs ahead of."""
    comm.Barrier()
    out = []
    for _ in range(iters):
        if aligned:
            comm.Barrier()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def interleaved_medians(cases, iters: int, comm, per_round: int = 5) -> tuple:
    """Each of cases (callables) warmed up once, then timed in rounds of
    per_round calls each, the cases alternating round by round (so that a
    change of the machine's load meets every case alike); the median time
    of each, the slowest rank's."""
    from mpi4py import MPI

    for fn in cases:
        fn()
    times = [[] for _ in cases]
    for _ in range(max(3, iters // per_round)):
        for fn, t in zip(cases, times):
            t += time_calls(fn, per_round, comm)
    return tuple(comm.allreduce(statistics.median(x), op=MPI.MAX) for x in times)

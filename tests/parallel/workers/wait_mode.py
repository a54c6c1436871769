"""How waits spin on this host (progress.h, no_yield_us): each rank first
pins itself, then init() decides from the union of the host's ranks' CPUs.

argv[1]: "own" (rank r on CPU r: a core per rank, so waits look a few
microseconds before they yield) or "shared" (every rank on one CPU: waits
yield at once). Either way the collectives give the right results."""
import os
import sys

import numpy as np

import commlib
from _common import check_equal, done, fail
from commlib.launch._rankwrap import get_rank

mode = sys.argv[1]
cpus = sorted(os.sched_getaffinity(0))
rank = int(get_rank())  # (before init: from the launcher's environment)
os.sched_setaffinity(0, {cpus[rank % len(cpus)] if mode == "own" else cpus[0]})
commlib.init()
r, n = commlib.rank(), commlib.size()
state = commlib.engine_state()
want = {"own": "waits look 5 us before yielding", "shared": "waits yield at once"}[mode]
if want not in state:
    fail(f"engine state {state!r} does not say {want!r}")
for k in range(200):  # (small allreduces: every wait is a short one)
    x = np.full(16, float(r + k), np.float32)
    check_equal(commlib.allreduce(x, name=f"w.{k % 3}", op=commlib.Sum),
                np.full(16, float(n * k + n * (n - 1) // 2), np.float32), f"allreduce {k}")
done()

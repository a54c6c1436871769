"""barrier: ranks arrive at different times; an exchange of timestamps
(through mpi4py, on one host, so one clock) shows that no rank left the
barrier before the last one arrived."""
import time

import numpy as np
from mpi4py import MPI

import commlib
from coll_common import check_result, check_true, finish

commlib.init()
r, n = commlib.rank(), commlib.size()
comm = MPI.COMM_WORLD

DELAYS = {
    "r*0.2": lambda q: q * 0.2,
    "(n-1-r)*0.2": lambda q: (n - 1 - q) * 0.2,
    "coordinator late": lambda q: 0.4 if q == 0 else 0.0,
    "last rank late": lambda q: 0.4 if q == n - 1 else 0.0,
}
for name, delay in DELAYS.items():
    comm.Barrier()
    time.sleep(delay(r))
    arrived = time.time()
    ret = commlib.barrier()
    left = time.time()
    check_true(ret is None, f"barrier returned {ret!r}")
    stamps = comm.allgather((arrived, left))
    last_arrival = max(a for a, _ in stamps)
    first_exit = min(lv for _, lv in stamps)
    check_true(first_exit >= last_arrival,
               f"barrier ({name}): a rank left at {first_exit:.4f} before the last arrived at "
               f"{last_arrival:.4f} (stamps {stamps})")

# many barriers in a row, and barriers with other collectives in flight
for _ in range(50):
    commlib.barrier()
h = commlib.allreduce_async(np.full(4, r + 1.0), op=commlib.Sum, name="around.barrier")
commlib.barrier()
check_result(commlib.synchronize(h), np.full(4, n * (n + 1) / 2.0), "allreduce in flight across a barrier")

finish()

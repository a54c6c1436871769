"""Who drives the engine: a thread waiting in synchronize runs its cycles
itself, the background thread does otherwise.

1. Asynchronous requests progress with nobody waiting: right after a
   synchronous allreduce (the background thread then naps while a waiter
   drives), async allreduces submitted next complete while the caller only
   sleeps (poll turns True without synchronize).
2. Several Python threads wait (and drive) at once: each thread's results are
   right on every rank.
3. A long collective outlasts the waiter's spin budget: the waiter goes to
   sleep and the background thread finishes the collective.
"""
import threading
import time

import numpy as np

import commlib
from _common import check_equal, done, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
total = n * (n - 1) / 2

# 1. progress without a waiter
commlib.allreduce(np.ones(4), name="warm", op=commlib.Sum)
handles = [commlib.allreduce_async(np.full(8, float(r + k)), name=f"nowait.{k}", op=commlib.Sum)
           for k in range(5)]
deadline = time.monotonic() + 10.0
while not all(commlib.poll(h) for h in handles):
    if time.monotonic() > deadline:
        fail("asynchronous allreduces made no progress within 10 s without synchronize")
    time.sleep(0.001)
for k, h in enumerate(handles):
    check_equal(commlib.synchronize(h), np.full(8, total + n * k), f"nowait.{k}")

# 2. several waiting threads
errors = []


def worker(t):
    try:
        for i in range(40):
            x = np.arange(16, dtype=np.float64) * (t + 1) + r
            got = commlib.allreduce(x, name=f"thread{t}.{i}", op=commlib.Sum)
            want = np.arange(16, dtype=np.float64) * (t + 1) * n + total
            if not np.array_equal(got, want):
                errors.append(f"thread {t} call {i}: {got[:4]} != {want[:4]}")
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(f"thread {t}: {type(e).__name__}: {e}")


threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
for th in threads:
    th.start()
for th in threads:
    th.join(60)
    if th.is_alive():
        fail("a waiting thread did not finish within 60 s")
if errors:
    fail("; ".join(errors[:3]))

# 3. longer than the spin budget (COMMLIB_SPIN_US=200 in this test)
big = np.full(8 << 20, float(r))  # 64 MiB of float64
check_equal(commlib.allreduce(big, name="long", op=commlib.Sum)[::1 << 16], np.full(128, total),
            "64 MiB allreduce (the waiter sleeps, the background thread finishes it)")
done()

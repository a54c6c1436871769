"""Point-to-point and collectives from three threads of every rank at once:
two threads exchange around the ring with isend/irecv (each with its own
tag; one message in three posted before its thread computes a little) and a
blocking send/recv between ranks 0 and 1, while the third runs allreduce_async
and synchronize. Asynchronous requests start their point-to-point step on the
submitting thread whenever no other thread is inside the engine, so this runs
the engine from several callers, and the background thread, concurrently.
Every result is checked against numpy."""
from __future__ import annotations

import threading
import time

import numpy as np

import commlib
from _common import check_equal, done, fail

commlib.init()
me, n = commlib.rank(), commlib.size()
right, left = (me + 1) % n, (me - 1) % n
ITERS = 1500
errors: list[str] = []


def ring(tag: int) -> None:
    try:
        for i in range(ITERS):
            size = 100 + (i % 7) * 3000  # header-carried and single-copy messages
            r = commlib.irecv(left, tag=tag)
            s = commlib.isend(np.full(size, me * 100000 + i, np.float64), right, tag=tag)
            if i % 3 == 0:
                time.sleep(0.0002)  # computing while the exchange goes on
            check_equal(commlib.synchronize(r), np.full(size, left * 100000 + i, np.float64),
                        f"ring tag {tag} message {i}")
            commlib.synchronize(s)
            out = np.empty(5, np.int32)
            if me == 0:
                commlib.send(np.arange(5, dtype=np.int32) + i, 1, tag=tag + 100)
            elif me == 1:
                commlib.recv(0, tag=tag + 100, out=out)
                check_equal(out, np.arange(5, dtype=np.int32) + i, f"blocking tag {tag + 100} message {i}")
    except Exception as e:  # (a thread's failure must reach the main thread's exit status)
        errors.append(f"ring {tag}: {e!r}")


def collectives() -> None:
    try:
        for i in range(ITERS):
            h = commlib.allreduce_async(np.full(3000, float(me + i)), op=commlib.Sum, name=f"threads.{i % 4}")
            if i % 5 == 0:
                time.sleep(0.0003)
            check_equal(commlib.synchronize(h), np.full(3000, float(sum(r + i for r in range(n)))),
                        f"allreduce {i}")
    except Exception as e:
        errors.append(f"collectives: {e!r}")


threads = [threading.Thread(target=ring, args=(1,)), threading.Thread(target=ring, args=(2,)),
           threading.Thread(target=collectives)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if errors:
    fail("; ".join(errors[:3]))
done()
commlib.shutdown()

"""Point-to-point between ranks 1 and 2 needs no rank 0 (3 ranks).

1. Rank 0 shuts down and exits while rank 2 is stopped (SIGSTOP for 5 s by
   a helper process) and rank 1's send to it waits: once rank 2 runs again
   and receives it, rank 1's send completes without error.
2. With rank 0 gone: messages of every size class (inside the header, one
   copy, split copy) both ways between ranks 1 and 2, blocking and not.
3. Collectives of the process set {1, 2} still work (rank 0 negotiates
   them until both have shut down; its own shutdown() returns then): every
   kind, several sizes, checked against numpy. Those of the whole job or of
   the set {0, 1} raise NotInitializedError naming rank 0 at once.
"""
import os
import subprocess
import sys
import time

import numpy as np

import commlib
from _common import check_equal, done, expect_raises, fail
from _set_collectives import check_set_collectives

commlib.init()
r = commlib.rank()
if commlib.size() != 3:
    fail("run me on 3 ranks")
pair = commlib.add_process_set([1, 2])
with0 = commlib.add_process_set([0, 1])
pids = commlib.allgather(np.array([os.getpid()]), name="pids")
commlib.barrier()

# 1. The receiver frozen while rank 0 leaves.
if r == 0:
    pid2 = int(pids[2])
    helper = subprocess.Popen(["sh", "-c", f"kill -STOP {pid2}; sleep 5; kill -CONT {pid2}"])
    time.sleep(0.5)  # (rank 2 is stopped by now: rank 0 leaves before its receive)
    commlib.shutdown()
    helper.wait()
    print("rank 0: OK", flush=True)
    sys.exit(0)
x = np.arange(1000, dtype=np.float64)
if r == 1:
    start = time.monotonic()
    commlib.send(x, dst=2, tag=1)  # returns once rank 2 has taken it, after its freeze
    if time.monotonic() - start < 3:
        fail(f"the send returned after {time.monotonic() - start:.1f} s, before rank 2 was resumed")
else:
    time.sleep(1.0)  # (stopped in here)
    check_equal(commlib.recv(src=1, tag=1), x, "the message received after the freeze")

# 2. Every size class, both ways, with rank 0 gone.
for count in (1, 300, 20000, 200000, 1 << 20):
    mine = np.arange(count, dtype=np.float32) + r
    other = 3 - r
    got = commlib.sendrecv(mine, dst=other, src=other, send_tag=count, recv_tag=count)
    check_equal(got, np.arange(count, dtype=np.float32) + other, f"sendrecv of {count}")
    if r == 1:
        commlib.send(mine, dst=2, tag=2)
        check_equal(commlib.synchronize(commlib.irecv(src=2, tag=3)), mine + 1, f"irecv of {count}")
    else:
        check_equal(commlib.recv(src=1, tag=2), mine - 1, f"recv of {count}")
        commlib.synchronize(commlib.isend(mine, dst=1, tag=3))

# 3. Collectives of {1, 2} need no rank 0; those involving it fail at once.
check_set_collectives(pair, "pair")
checks = [("a collective of the whole job", lambda: commlib.allreduce(np.ones(2), name="whole"))]
if r == 1:
    checks.append(("a collective of the set {0, 1}",
                   lambda: commlib.allreduce(np.ones(2), name="with0", process_set=with0)))
for what, fn in checks:
    start = time.monotonic()
    expect_raises(commlib.NotInitializedError, fn, what, match="rank 0")
    if time.monotonic() - start > 2:
        fail(f"{what} took {time.monotonic() - start:.1f} s to fail")
check_set_collectives(pair, "again", sizes=(5,))
check_equal(commlib.sendrecv(np.ones(3) * r, dst=3 - r, src=3 - r), np.ones(3) * (3 - r), "a sendrecv at the end")
done()

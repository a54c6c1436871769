"""A rank freezes (SIGSTOP on itself) before a request the others wait on:
the others raise CollectiveTimeoutError naming it after COMMLIB_TIMEOUT, and
at exit they abort MPI instead of waiting in MPI_Finalize for it forever, so
the whole job (the frozen rank included: mpiexec kills it) ends.

Usage: frozen_rank.py MODE VICTIM DIR. MODE: allreduce, grouped or p2p (a
receive from the frozen rank). Every rank writes its pid into DIR (the test
checks none is left); the victim writes the time of its freeze to
DIR/frozen_at. The survivors print "rank R: raised ..." and exit normally."""
import os
import signal
import sys
import time

import numpy as np

import commlib
from _common import fail

commlib.init()
r = commlib.rank()
mode, victim, where = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(os.path.join(where, f"pid.{os.getpid()}"), "w") as f:
    f.write(str(r))
commlib.allreduce(np.ones(4), name="warm-up")
commlib.barrier()
if r == victim:
    with open(os.path.join(where, "frozen_at.tmp"), "w") as f:
        f.write(repr(time.time()))
    os.replace(os.path.join(where, "frozen_at.tmp"), os.path.join(where, "frozen_at"))
    os.kill(os.getpid(), signal.SIGSTOP)  # (never resumed: mpiexec kills it)
    fail("resumed")
start = time.monotonic()
try:
    if mode == "allreduce":
        commlib.allreduce(np.ones(4), name="frozen")
    elif mode == "grouped":
        commlib.grouped_allreduce([np.ones(4), np.ones(3, np.float32)], name="frozen.group")
    elif mode == "p2p":
        commlib.recv(src=victim, tag=7)
    else:
        fail(f"unknown mode {mode}")
    fail(f"{mode} with rank {victim} frozen completed")
except commlib.CollectiveTimeoutError as e:
    if str(victim) not in str(e):
        fail(f"the error does not name rank {victim}: {e}")
    print(f"rank {r}: raised CollectiveTimeoutError after {time.monotonic() - start:.1f} s: {e}", flush=True)
# (the script ends: commlib's exit handler shuts down, and MPI is aborted, not finalized)

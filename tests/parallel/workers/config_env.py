"""A bad COMMLIB_* value: init() raises ValueError on every rank, naming the
variable and the value, whether every rank has the bad value or only some.

    config_env.py all        every rank has COMMLIB_FUSION_THRESHOLD=abc (set by the test)
    config_env.py one        only rank 1 has COMMLIB_ALLREDUCE_ALGO=bogus
    config_env.py each       rank 0 has a bad COMMLIB_SPIN_US, rank 1 a bad COMMLIB_SHM
    config_env.py uncaught   only rank 1 has a bad value and nobody catches the error
    config_env.py horovod    every rank has HOROVOD_FUSION_THRESHOLD=abc (set by the test)

After a caught error each rank fixes its environment, and init() and an
allreduce work: a refused init leaves nothing behind and no rank out of step.
"""
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import commlib

RANK = MPI.COMM_WORLD.rank
mode = sys.argv[1]


def fail(msg):
    print(f"rank {RANK}: FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def init_error():
    start = time.monotonic()
    try:
        commlib.init()
    except ValueError as e:
        if time.monotonic() - start > 20:
            fail(f"init took {time.monotonic() - start:.1f} s to fail")
        return str(e)
    fail("init accepted a bad value")


BAD = {
    "one": {1: ("COMMLIB_ALLREDUCE_ALGO", "bogus")},
    "each": {0: ("COMMLIB_SPIN_US", "-3"), 1: ("COMMLIB_SHM", "yes")},
    "uncaught": {1: ("COMMLIB_CYCLE_TIME", "1ms")},
}.get(mode, {})
if RANK in BAD:
    os.environ[BAD[RANK][0]] = BAD[RANK][1]

if mode == "uncaught":
    commlib.init()  # the ValueError ends every rank's script
    fail("init accepted a bad value")

message = init_error()
if mode == "all":
    want = "COMMLIB_FUSION_THRESHOLD='abc': not an integer"
    if message != want:
        fail(f"message {message!r}, expected {want!r}")
    del os.environ["COMMLIB_FUSION_THRESHOLD"]
elif mode == "horovod":
    want = "COMMLIB_FUSION_THRESHOLD='abc': not an integer (read from HOROVOD_FUSION_THRESHOLD='abc')"
    if message != want:
        fail(f"message {message!r}, expected {want!r}")
    del os.environ["HOROVOD_FUSION_THRESHOLD"], os.environ["COMMLIB_FUSION_THRESHOLD"]
elif mode == "one":
    want = "COMMLIB_ALLREDUCE_ALGO='bogus': not one of auto, shm, ring, tree, mpi"
    if RANK == 1 and message != want:
        fail(f"message {message!r}, expected {want!r}")
    if RANK != 1 and message != want + " (in the environment of rank 1)":
        fail(f"message {message!r} does not name rank 1's value")
    os.environ.pop("COMMLIB_ALLREDUCE_ALGO", None)
elif mode == "each":
    name, value = BAD[RANK]
    if not message.startswith(f"{name}={value!r}: "):
        fail(f"message {message!r} does not name this rank's {name}={value!r}")
    del os.environ[name]
else:
    fail(f"unknown mode {mode}")

commlib.init()
total = commlib.allreduce(np.ones(3) * (RANK + 1), op=commlib.Sum, name="after")
n = commlib.size()
if not np.array_equal(total, np.ones(3) * n * (n + 1) / 2):
    fail(f"allreduce after a refused init gave {total}")
commlib.shutdown()
print(f"rank {RANK}: OK", flush=True)

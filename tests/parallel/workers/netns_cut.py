"""Collectives across two real hosts while the test cuts one host's link.

argv: mode, control dir, elements per allreduce. Every rank runs steps of a
named allreduce (checked against numpy) until rank 0 finds <dir>/stop (its
flag travels in the allreduce, so every rank stops at the same step); rank 0
writes <dir>/ready after 20 steps, the test's signal to cut.

mode "heal": the cut is shorter than COMMLIB_TIMEOUT; every step must
complete right, and the longest step is printed (the test checks that the cut
really held the collectives up). mode "cut": the link stays down; each rank
must raise a CommlibError subclass and prints its type, the time and the
message (also to <dir>/raised<rank>), then exits 3 (the job must end: the test checks how and when)."""
import sys
import time
from pathlib import Path

import numpy as np

import commlib
from _common import check_equal, done, fail

commlib.init()
r, n = commlib.rank(), commlib.size()
mode, ctl, count = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
step, longest = 0, 0.0
while True:
    stop = 1.0 if r == 0 and (ctl / "stop").exists() else 0.0
    v = np.concatenate([np.full(count, float(r + step)), [stop]])
    t = time.monotonic()
    try:
        got = commlib.allreduce(v, op=commlib.Sum, name="step")
    except commlib.CommlibError as e:
        line = f"rank {r}: RAISED {type(e).__name__} at {time.time():.3f} after {step} steps: {e}"
        print(line, flush=True)
        # (also in a file: output of the far host's ranks travels over the cut link)
        (ctl / f"raised{r}").write_text(line)
        sys.exit(3)
    longest = max(longest, time.monotonic() - t)
    check_equal(got[:count], np.full(count, float(n * step + n * (n - 1) // 2)), f"step {step}")
    step += 1
    if step == 20 and r == 0:
        (ctl / "ready").write_text(f"{time.time():.3f}")
    if got[-1] > 0:
        break
    time.sleep(0.005)
if mode == "cut":
    fail(f"{step} steps completed although the link was cut")
print(f"rank {r}: {step} steps, the longest took {longest:.2f} s", flush=True)
done()

"""Horovod's tuning variables read as commlib's (commlib.horovod_env), on
every rank. argv[1]: the timeline path HOROVOD_TIMELINE names (expected to
be written), argv[2]: "unfused" when HOROVOD_FUSION_THRESHOLD=0 is set
(each of 4 allreduces submitted together then runs alone), else "fused"."""
import sys

import numpy as np
from _common import check_equal, fail

import commlib
from commlib.timeline import load_events, rank_file

path, mode = sys.argv[1], sys.argv[2]  # (each rank reads its own file)
commlib.init()
r, n = commlib.rank(), commlib.size()
xs = [np.full(64, r + 1.0, np.float32) for _ in range(4)]
for h in [commlib.allreduce_async_(x, op=commlib.Sum, name=f"hv.{i}") for i, x in enumerate(xs)]:
    commlib.synchronize(h)
for i, x in enumerate(xs):
    check_equal(x, np.full(64, n * (n + 1) / 2, np.float32), f"allreduce hv.{i}")
commlib.shutdown()  # (the timeline is complete once shut down)
fused = [e["args"]["fused_count"] for e in load_events(rank_file(path, r)) if e.get("name") == "allreduce"]
if not fused:
    fail(f"no allreduce in the timeline {path}")
if mode == "unfused" and max(fused) != 1:
    fail(f"with HOROVOD_FUSION_THRESHOLD=0 allreduces were fused: {fused}")
if mode == "fused" and max(fused) < 2:
    fail(f"the 4 allreduces were never fused: {fused}")
print(f"rank {r}: OK", flush=True)

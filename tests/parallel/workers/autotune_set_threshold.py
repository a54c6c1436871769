"""commlib_set_fusion_threshold called on one rank only (the last): the new
threshold takes effect on every rank after the same collectives, so fused
allreduces (several submitted together, checked against numpy) stay right
while the threshold changes; every rank reports the same change."""
import numpy as np

import commlib
from _common import check_equal, done, fail
from autotune_common import check_same_everywhere, history

commlib.init()
r, n = commlib.rank(), commlib.size()
lib = commlib._lib.lib
NEW = 0  # from the default 64 MiB: every tensor a window of its own
SIZES = [3000, 500, 7000, 1200]
if r == n - 1 and lib.commlib_set_fusion_threshold(NEW) != 0:
    fail("commlib_set_fusion_threshold failed")
for k in range(3000):
    base = [(np.arange(s) % 5).astype(np.float32) for s in SIZES]
    handles = [commlib.allreduce_async(b * (r + 1) + k, name=f"t.{i}", op=commlib.Sum) for i, b in enumerate(base)]
    for i, (h, b) in enumerate(zip(handles, base)):
        check_equal(commlib.synchronize(h), b * (n * (n + 1) // 2) + n * k, f"round {k} tensor {i}")
    now = np.array([int(lib.commlib_fusion_threshold() == NEW)], dtype=np.int32)
    if commlib.allreduce(now, op=commlib.Min, name="applied")[0]:
        break
else:
    fail(f"the threshold set on rank {n - 1} never took effect on every rank")
hist = history()
check_same_everywhere(hist)
if hist.shape[0] != 1 or hist[0, 1] != NEW or hist[0, 4] != 0:
    fail(f"expected one change to {NEW}: {hist.tolist()}")
done()

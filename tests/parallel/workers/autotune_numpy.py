"""Autotune (COMMLIB_AUTOTUNE=1, a small search budget set by the test) in a
loop of named allreduces of several sizes, submitted together and checked
against numpy every step: every rank applies the same settings after the
same collectives, the search ends at the best-scored setting (rank 0's CSV
log, argument 1) and nothing changes after it.

Argument 2: the tree/ring cutoff is expected to be tuned (no shared memory).
"""
import sys

import numpy as np

import commlib
from _common import check_equal, done, fail
from autotune_common import check_log, check_same_everywhere, history, run_until_final

commlib.init()
r, n = commlib.rank(), commlib.size()
LOG, TREE = sys.argv[1], sys.argv[2] == "tree"
SIZES = [1000, 30000, 5000, 70000, 200, 120000]  # float32 elements


def step(k):
    base = [(np.arange(s) % 7).astype(np.float32) for s in SIZES]
    handles = [commlib.allreduce_async(b + r + k, name=f"grad.{i}", op=commlib.Sum) for i, b in enumerate(base)]
    for i, (h, b) in enumerate(zip(handles, base)):
        check_equal(commlib.synchronize(h), n * (b + k) + n * (n - 1) // 2, f"step {k} tensor {i}")


steps = run_until_final(step, 400)
hist = history()
check_same_everywhere(hist)
if hist[-1, 4] != 1 or hist[:-1, 4].any():
    fail(f"the final setting is not last, or not alone: {hist.tolist()}")
trees = set(hist[:, 3].tolist())
if TREE != (len(trees) > 1):
    fail(f"tree/ring cutoffs applied {sorted(trees)} (expected {'several' if TREE else 'one'})")
if commlib._lib.lib.commlib_fusion_threshold() != hist[-1, 1]:
    fail("the fusion threshold in force is not the final setting")
for k in range(steps, steps + 5):  # it stays fixed
    step(k)
if len(history()) != len(hist):
    fail(f"settings changed after the final one: {history().tolist()}")
if r == 0:
    check_log(LOG, hist, (0, 1000, 16384))
print(f"rank {r}: {steps} steps, settings {hist.tolist()}", flush=True)
done()

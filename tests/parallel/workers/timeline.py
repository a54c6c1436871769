"""The timeline (commlib/timeline.py, csrc/base/timeline.h): every rank
writes a valid Chrome trace with the phases of each tensor; rank 0 also sees
every rank's request arrive. argv[1]: the timeline path; argv[2]: "env" when
COMMLIB_TIMELINE started it at init (else start/stop_timeline do)."""
import json
import os
import sys

import numpy as np
from _common import check_equal, expect_raises

import commlib

path, mode = sys.argv[1], sys.argv[2]
if mode == "api":
    expect_raises(commlib.NotInitializedError, lambda: commlib.start_timeline(path), "start before init")
commlib.init()
r, n = commlib.rank(), commlib.size()
if mode == "api":
    expect_raises(ValueError, lambda: commlib.start_timeline("/nonexistent-dir/t.json"), "unwritable path",
                  match="cannot write")
    commlib.start_timeline(path, mark_cycles=True)
    expect_raises(ValueError, lambda: commlib.start_timeline(path), "a second timeline", match="already")

ROUNDS = 3
for i in range(ROUNDS):
    check_equal(commlib.allreduce(np.full(1000, r + 1.0, np.float32), op=commlib.Sum, name="big"),
                np.full(1000, n * (n + 1) / 2, np.float32), "allreduce")
    handles = [commlib.allreduce_async(np.full(8, float(j), np.float32), name=f"small.{j}") for j in range(4)]
    for j, h in enumerate(handles):
        check_equal(commlib.synchronize(h), np.full(8, float(j), np.float32), f"small.{j}")
check_equal(commlib.allgather(np.full((1, 2), r, np.int32), name="gather"),
            np.repeat(np.arange(n, dtype=np.int32), 2).reshape(n, 2), "allgather")
if r == 0:
    commlib.send(np.arange(4.0), 1, tag=7)
elif r == 1:
    check_equal(commlib.recv(0, tag=7), np.arange(4.0), "recv")
# A failed collective: the ERROR mark names it on every rank.
shape = (3,) if r == 0 else (4,)
expect_raises(commlib.CollectiveMismatchError, lambda: commlib.allreduce(np.ones(shape), name="mismatch"),
              "mismatched shapes")
if mode == "api":
    commlib.stop_timeline()
    commlib.stop_timeline()  # a second stop does nothing
    commlib.allreduce(np.ones(2), name="after.stop")  # not recorded
commlib.barrier()
commlib.shutdown()



def fail(msg):  # (commlib.rank() is gone after shutdown)
    print(f"rank {r}: FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


# Every rank checks its own file, then rank 0 the merged one (all ranks wrote theirs: shutdown closed them).
stem, ext = os.path.splitext(path)
own = path if r == 0 else f"{stem}.rank{r}{ext}"
with open(own, encoding="utf-8") as f:
    events = json.load(f)  # complete JSON: stop/shutdown closed the array
rows = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
by_tensor = {}
for e in events:
    if e["ph"] in ("X", "i") and e["tid"] in rows:
        by_tensor.setdefault(rows[e["tid"]], []).append(e)
    if e["pid"] != r:
        fail(f"event with pid {e['pid']} in rank {r}'s file")


def names(tensor):
    return [e["name"] for e in by_tensor.get(tensor, [])]


if names("big").count("allreduce") != ROUNDS or "ERROR" in names("big"):
    fail(f"'big' should run and complete {ROUNDS} times: {names('big')}")
for phase in ("QUEUE", "NEGOTIATE"):
    if names("big").count(phase) != ROUNDS:
        fail(f"'big' lacks its {phase} phases: {names('big')}")
execs = [e for e in by_tensor["big"] if e["name"] == "allreduce"]
if any(e["args"]["bytes"] != 4000 or not e["args"]["algorithm"] or e["dur"] < 0 for e in execs):
    fail(f"allreduce args wrong: {execs[0]['args']}")
negs = [e for e in by_tensor["big"] if e["name"] == "NEGOTIATE"]
if not any(e["args"]["cache_hit"] for e in negs[1:]):
    fail(f"repeated 'big' never came through the cache: {[e['args'] for e in negs]}")
if names("big").count("CACHE_HIT") < 1:
    fail("no CACHE_HIT mark for a repeated tensor")
fused = [(f"small.{j}", e) for j in range(4) for e in by_tensor[f"small.{j}"] if e["name"] == "allreduce"]
if max(e["args"]["fused_count"] for _, e in fused) < 2:
    fail(f"the async small tensors were never fused: {[e['args'] for _, e in fused]}")
# Which of them share a batch depends on when the background thread wakes;
# every batch of several must name its members, the row's own tensor among them.
for tensor, e in fused:
    a = e["args"]
    if a["fused_count"] > 1 and (a["fused_bytes"] != 32 * a["fused_count"] or tensor not in a["fused_with"]
                                 or len(a["fused_with"]) != a["fused_count"]):
        fail(f"fusion args wrong for {tensor}: {a}")
if "allgather" not in names("gather"):
    fail(f"allgather missing: {names('gather')}")
err = [e for e in by_tensor.get("mismatch", []) if e["name"] == "ERROR"]
if len(err) != 1 or "shape" not in err[0]["args"]["message"]:
    fail(f"the mismatched allreduce's ERROR mark: {by_tensor.get('mismatch')}")
# (rank 0 may still see another rank's request arrive before its own stop)
if [e for e in by_tensor.get("after.stop", []) if e["name"] != "RANK_READY"]:
    fail(f"recorded after stop_timeline(): {by_tensor['after.stop']}")
if r == 0:
    ready = {e["args"]["rank"] for e in by_tensor["gather"] if e["name"] == "RANK_READY"}
    if ready != set(range(n)):
        fail(f"rank 0 saw requests for 'gather' from {ready}, expected every rank")
    if "SEND" not in names("send to 1 tag 7"):
        fail("no SEND row")
if r == 1 and "RECV" not in names("recv from 0 tag 7"):
    fail("no RECV row")
if mode == "api" and not any(e["name"] == "CYCLE" for e in events):
    fail("mark_cycles=True wrote no CYCLE marks")
if mode == "env" and any(e["name"] == "CYCLE" for e in events):
    fail("CYCLE marks without COMMLIB_TIMELINE_MARK_CYCLES")
print(f"rank {r}: OK", flush=True)

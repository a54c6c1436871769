"""Helpers of the autotune workers: the settings history every rank applied
(commlib.autotune_history), compared across ranks, and rank 0's CSV log."""
from __future__ import annotations

import csv

import numpy as np

import commlib
from _common import check_equal, fail

COLUMNS = ["sample", "fusion_threshold_bytes", "cycle_time_ms", "tree_max_bytes", "score_bytes_per_s",
           "window_scores", "chosen"]


def history() -> np.ndarray:
    """This rank's settings changes, one row each: collectives run before,
    fusion threshold, cycle time (us), tree max bytes, final (0/1)."""
    rows = [[h["collectives"], h["fusion_threshold"], round(h["cycle_time_ms"] * 1000), h["tree_max_bytes"],
             int(h["final"])] for h in commlib.autotune_history()]
    return np.array(rows, dtype=np.int64).reshape(-1, 5)


def check_same_everywhere(hist: np.ndarray) -> None:
    """Every rank applied the same settings after the same collectives."""
    lengths = commlib.allgather(np.array([len(hist)], dtype=np.int64), name="tune.lengths")
    if len(set(lengths.tolist())) != 1:
        fail(f"ranks applied different numbers of settings: {lengths.tolist()} (mine: {hist.tolist()})")
    check_equal(hist, commlib.broadcast(hist, root_rank=0, name="tune.history"),
                "settings history (collectives before, fusion, cycle us, tree, final) against rank 0's")


def run_until_final(step, max_steps: int) -> int:
    """Runs step(k) until every rank has applied autotune's final setting;
    the ranks agree on when (so they run the same collectives). Returns the
    number of steps."""
    for k in range(max_steps):
        step(k)
        final = history()[:, 4].any() if len(history()) else False
        if commlib.allreduce(np.array([int(final)], dtype=np.int32), op=commlib.Min, name="tune.final")[0]:
            return k + 1
    fail(f"autotune did not finish within {max_steps} steps: {history().tolist()}")


def check_log(path: str, hist: np.ndarray, start: tuple) -> list:
    """Rank 0's CSV: a row per setting scored (start first, then each trial
    in the order applied), exactly one chosen, the best-scored, and it is
    the final setting. Returns the rows."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0] != COLUMNS:
        fail(f"{path}: header {rows[:1]} != {COLUMNS}")
    body = [dict(zip(COLUMNS, r)) for r in rows[1:]]
    settings = [(int(b["fusion_threshold_bytes"]), round(float(b["cycle_time_ms"]) * 1000),
                 int(b["tree_max_bytes"])) for b in body]
    trials = [tuple(int(x) for x in h[1:4]) for h in hist if h[4] == 0]
    final = [tuple(int(x) for x in h[1:4]) for h in hist if h[4] == 1]
    if settings != [start] + trials:
        fail(f"{path}: settings {settings} != the start {start} and the trials applied {trials}")
    if len(settings) != len(set(settings)):
        fail(f"{path}: a setting was scored twice: {settings}")
    chosen = [i for i, b in enumerate(body) if b["chosen"] == "1"]
    scores = [int(b["score_bytes_per_s"]) for b in body]
    if len(chosen) != 1 or any(b["chosen"] not in ("0", "1") for b in body):
        fail(f"{path}: chosen column {[b['chosen'] for b in body]}")
    if min(scores) <= 0 or scores[chosen[0]] != max(scores):
        fail(f"{path}: chosen row {chosen[0]} scores {scores[chosen[0]]}, the best is {max(scores)}")
    if final != [settings[chosen[0]]]:
        fail(f"final setting applied {final} != the chosen one {settings[chosen[0]]}")
    return body

"""The timeline: what happened to each tensor on each rank, as Chrome-trace
JSON (open it in https://ui.perfetto.dev or chrome://tracing).

Switch it on for a whole run with ``COMMLIB_TIMELINE=/path/timeline.json``,
or between two points of a script with ``commlib.start_timeline(path)`` and
``commlib.stop_timeline()`` (Horovod's names). Each rank writes its own file:
rank 0 the path itself, rank r ``<stem>.rank<r><ext>`` beside it;
``python -m commlib.timeline merge timeline.json`` joins them into one
trace with a row group per rank; ``python -m commlib.timeline phases
timeline.json`` prints each rank's spans by phase (counts, total and longest
time, the tensors of the longest): where a step's time went.

Per tensor (one row each, named by the tensor): ``QUEUE`` (held for
batching), ``NEGOTIATE`` (until every rank submitted it; ``cache_hit``
says whether it skipped rank 0), on rank 0 a ``RANK_READY`` mark when each
rank's request arrived, the execution (the operation's name, with
``algorithm``, ``bytes``, ``fused_count``/``fused_with``), whose end is the
request's completion, or an ``ERROR`` mark; point-to-point transfers get
``SEND``/``RECV`` rows per peer and tag; with ``mark_cycles`` a ``CYCLE``
mark per busy background cycle.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys


# The core (and with it MPI) loads only for start/stop: merging files needs neither.


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing this rank's timeline to ``file_path`` (see the module
    doc for the file of each rank). Raises ValueError when a timeline is
    already on or the file cannot be created."""
    from ._lib import check, lib
    from .runtime import require_init

    require_init()
    if not isinstance(file_path, (str, os.PathLike)):
        raise TypeError(f"file_path must be a path, got {type(file_path).__name__}")
    check(lib.commlib_start_timeline(os.fsencode(file_path), 1 if mark_cycles else 0))


def stop_timeline() -> None:
    """Writes what is buffered and closes this rank's timeline (a complete
    JSON array). Does nothing when no timeline is on; shutdown() stops it."""
    from ._lib import check, lib

    check(lib.commlib_stop_timeline())


def rank_file(path: str, rank: int) -> str:
    """The file rank ``rank`` writes for ``path``: the path itself on rank 0,
    ``<stem>.rank<rank><ext>`` on the others."""
    if rank == 0:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext}"


def rank_files(path: str) -> list[str]:
    """The files the ranks of a job wrote for ``path``: rank 0's first, then
    rank 1, 2, ... (as many as exist)."""
    stem, ext = os.path.splitext(path)
    others = glob.glob(glob.escape(stem) + ".rank*" + glob.escape(ext))

    def rank_of(name: str) -> int:
        middle = name[len(stem) + len(".rank"):len(name) - len(ext)]
        return int(middle) if middle.isdigit() else -1

    ranked = sorted((r, f) for f in others if (r := rank_of(f)) > 0)
    return ([path] if os.path.exists(path) else []) + [f for _, f in ranked]


def load_events(path: str) -> list[dict]:
    """The events of one rank's file; a file whose writer was killed before
    closing it (no final ``]``, as the Chrome-trace format allows) loads too."""
    with open(path, encoding="utf-8") as f:
        text = f.read().rstrip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    events = json.loads(text)
    if not isinstance(events, list):
        raise ValueError(f"{path}: not a Chrome-trace event array")
    return events


def merge(path: str, out: str | None = None) -> str:
    """Joins the ranks' files for ``path`` into ``out`` (default:
    ``<stem>.merged<ext>``); returns the path written."""
    files = rank_files(path)
    if not files:
        raise FileNotFoundError(f"no timeline files for {path}")
    stem, ext = os.path.splitext(path)
    out = out or f"{stem}.merged{ext or '.json'}"
    events = [e for f in files for e in load_events(f)]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(events, f)
    return out


def phases(events: list[dict], longest: int = 3) -> list[str]:
    """A table of one rank's spans by phase, in the order each phase first
    started: how many, their total and longest duration, when the first
    started and the last ended (ms from the first event), and the tensors
    of the longest ones: where a step's time went (a first step's
    ``NCCL_INIT``, ``NEGOTIATE``, the executions)."""
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        return ["(no spans)"]
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    t0 = min(e["ts"] for e in events if "ts" in e)
    by_phase: dict = {}
    for e in sorted(spans, key=lambda e: e["ts"]):
        by_phase.setdefault(e["name"], []).append(e)
    out = [f"{'phase':<16}{'spans':>7}{'total ms':>11}{'max ms':>9}{'first ms':>10}{'last ms':>10}  longest"]
    for name, group in by_phase.items():
        durs = [e.get("dur", 0) for e in group]
        top = sorted(group, key=lambda e: -e.get("dur", 0))[:longest]
        out.append(f"{name:<16}{len(group):>7}{sum(durs) / 1e3:>11.1f}{max(durs) / 1e3:>9.1f}"
                   f"{(group[0]['ts'] - t0) / 1e3:>10.1f}{(max(e['ts'] + e.get('dur', 0) for e in group) - t0) / 1e3:>10.1f}"
                   f"  {', '.join(rows.get(e['tid'], '?') for e in top)}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m commlib.timeline",
                                     description="Work with commlib's per-rank timeline files.")
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="join every rank's file into one Chrome trace")
    m.add_argument("path", help="the path given to COMMLIB_TIMELINE / start_timeline")
    m.add_argument("-o", "--output", help="merged file (default: <stem>.merged<ext>)")
    p = sub.add_parser("phases", help="each rank's spans by phase: counts, total and longest, first and last")
    p.add_argument("path", help="the path given to COMMLIB_TIMELINE / start_timeline")
    args = parser.parse_args(argv)
    try:
        if args.command == "phases":
            files = rank_files(args.path)
            if not files:
                raise FileNotFoundError(f"no timeline files for {args.path}")
            for r, f in enumerate(files):
                print(f"rank {r} ({f}):")
                print("\n".join(phases(load_events(f))))
            return 0
        written = merge(args.path, args.output)
    except (OSError, ValueError) as e:
        print(f"commlib.timeline: {e}", file=sys.stderr)
        return 1
    print(f"merged {len(rank_files(args.path))} rank file(s) into {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

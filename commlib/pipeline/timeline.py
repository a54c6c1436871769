"""Where a pipeline step's time went, from the ranks' timelines.

A schedule asked to record one (``schedule.record_timeline = True`` in
commlib.torch.pipelining) lists, for the last step on each rank, what it ran
and when: ``(kind, stage, microbatch, t_start, t_end)`` for every action
(``F``, ``B``, ``SEND_*``: posting the send, ``RECV_*``: waiting for a
receive posted earlier), plus ``POST`` (posting the step's receives) and
``FINISH`` (waiting for the step's sends). Times are ``time.perf_counter()``
seconds, which on Linux is one clock for every process of a host.

``p2p_seconds(timelines)`` splits each rank's time inside send/recv calls
into what moving the messages cost and what was waiting for the peer to
reach its send (the pipeline's bubble, not the transport's cost): a wait
for a message, up to the moment its sender finished posting it, is the
bubble; the rest of the wait, every posting and the final wait for the sends
are point-to-point cost. Needs the timelines of every rank of the pipeline
(gathered, e.g. with allgather of ``encode(...)``), from one host.
"""
from __future__ import annotations

from .actions import KINDS, RECVS, SENDS, Action, message

EXTRA = ("POST", "FINISH")
_CODES = KINDS + EXTRA


def encode(events: list[tuple]) -> list[list[float]]:
    """Rows of numbers (kind code, stage, microbatch, t_start, t_end), to
    gather across ranks as one float64 tensor or array."""
    return [[float(_CODES.index(k)), float(s), float(i), t0, t1] for k, s, i, t0, t1 in events]


def decode(rows) -> list[tuple]:
    return [(_CODES[int(r[0])], int(r[1]), int(r[2]), float(r[3]), float(r[4])) for r in rows]


def p2p_seconds(timelines: list[list[tuple]]) -> list[dict]:
    """Per rank: ``step`` (first start to last end), ``compute`` (F and B),
    ``calls`` (everything inside send/recv calls), ``p2p`` (the part of
    ``calls`` that moved messages) and ``peer_wait`` (the part that waited
    for a peer that had not sent yet)."""
    posted: dict[tuple, float] = {}
    for events in timelines:
        for k, s, i, _t0, t1 in events:
            if k in SENDS:
                posted[message(Action(k, s, i))] = t1
    out = []
    for r, events in enumerate(timelines):
        if not events:
            out.append({"step": 0.0, "compute": 0.0, "calls": 0.0, "p2p": 0.0, "peer_wait": 0.0})
            continue
        compute = calls = peer_wait = 0.0
        for k, s, i, t0, t1 in events:
            if k in ("F", "B"):
                compute += t1 - t0
                continue
            calls += t1 - t0
            if k in RECVS:
                key = message(Action(k, s, i))
                if key not in posted:
                    raise ValueError(f"rank {r}: {Action(k, s, i)} has no send in the timelines "
                                     "(gather every pipeline rank's timeline)")
                peer_wait += max(0.0, min(t1, posted[key]) - t0)
        step = max(e[4] for e in events) - min(e[3] for e in events)
        out.append({"step": step, "compute": compute, "calls": calls,
                    "p2p": calls - peer_wait, "peer_wait": peer_wait})
    return out

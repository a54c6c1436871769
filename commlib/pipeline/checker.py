"""Checks a pipeline schedule before it runs, by simulating every rank.

    check(lists, num_stages, microbatches)   # raises ScheduleError, or returns the simulation

Each rank runs its list in order. A compute action needs data produced by an
earlier action of its own rank (a forward's input, a backward's forward and
output gradient); a send needs the compute that produces what it sends and
never blocks; a receive waits until the matching send has run on its peer.
The checker finds, without running anything:

* a send without a receive to take it (or a receive without a send), or two
  of them for one message;
* a forward or backward missing or repeated on the rank holding its stage;
* an action whose data no earlier action of its rank produces;
* a deadlock (receives waiting on each other in a cycle), named by every
  blocked rank, its action and what it waits for.

Every error names the rank, the action and the microbatch.
"""
from __future__ import annotations

from collections import Counter

from commlib.errors import CommlibError

from .actions import COMPUTE, RECVS, SENDS, Action, message, peer_stage, stage_rank


class ScheduleError(CommlibError, ValueError):
    """A pipeline schedule that would fail or hang; the message says where."""


def _check_messages(lists: list[list[Action]], p: int, num_stages: int) -> None:
    sends: dict[tuple, int] = {}
    recvs: dict[tuple, int] = {}
    for r, actions in enumerate(lists):
        for a in actions:
            if a.kind not in COMPUTE + SENDS + RECVS:
                raise ScheduleError(f"rank {r}: unknown action {a}")
            if not 0 <= a.stage < num_stages or stage_rank(a.stage, p) != r:
                raise ScheduleError(f"rank {r}: {a} names a stage rank {r} does not hold")
            if a.kind in COMPUTE:
                continue
            peer = peer_stage(a)
            if not 0 <= peer < num_stages:
                raise ScheduleError(f"rank {r}: {a} has no stage {peer} at the other end")
            book = sends if a.kind in SENDS else recvs
            key = message(a)
            if key in book:
                raise ScheduleError(f"rank {r}: {a} appears twice")
            book[key] = r
    for key, r in sends.items():
        if key not in recvs:
            a = _find(lists[r], key, SENDS)
            to = stage_rank(peer_stage(a), p)
            raise ScheduleError(f"rank {r}: {a} to rank {to} has no matching receive on rank "
                                f"{to}")
    for key, r in recvs.items():
        if key not in sends:
            a = _find(lists[r], key, RECVS)
            frm = stage_rank(peer_stage(a), p)
            raise ScheduleError(f"rank {r}: {a} from rank {frm} has no matching send on rank "
                                f"{frm}: it would wait forever")


def _find(actions, key, kinds) -> Action:
    return next(a for a in actions if a.kind in kinds and message(a) == key)


def _check_compute(lists: list[list[Action]], p: int, num_stages: int, m: int) -> None:
    for r, actions in enumerate(lists):
        counts = Counter(a for a in actions if a.kind in COMPUTE)
        for s in range(r, num_stages, p):
            for i in range(m):
                for kind in COMPUTE:
                    c = counts.get(Action(kind, s, i), 0)
                    if c != 1:
                        what = "is missing" if c == 0 else f"appears {c} times"
                        raise ScheduleError(f"rank {r}: {Action(kind, s, i)} {what}")
        extra = [a for a in counts if a.microbatch not in range(m)]
        if extra:
            raise ScheduleError(f"rank {r}: {extra[0]} is outside microbatches 0..{m - 1}")


def _needs(a: Action, p: int, num_stages: int) -> list[Action]:
    """What must have run earlier on the same rank for ``a`` to run."""
    s, i = a.stage, a.microbatch
    if a.kind == "F":
        if s == 0:
            return []
        return [Action("F" if stage_rank(s - 1, p) == stage_rank(s, p) else "RECV_F",
                       s - 1 if stage_rank(s - 1, p) == stage_rank(s, p) else s, i)]
    if a.kind == "B":
        needs = [Action("F", s, i)]
        if s < num_stages - 1:
            local = stage_rank(s + 1, p) == stage_rank(s, p)
            needs.append(Action("B", s + 1, i) if local else Action("RECV_B", s, i))
        return needs
    if a.kind in SENDS:
        return [Action(a.kind[-1], s, i)]
    return []


def _simulate(lists: list[list[Action]], p: int, num_stages: int) -> list[list[int]]:
    """Runs every rank's list in rounds (each round, every rank runs what it
    can); returns the round in which each action ran."""
    done = [set() for _ in lists]
    sent: set = set()
    pos = [0] * len(lists)
    rounds = [[-1] * len(actions) for actions in lists]
    clock = 0
    while any(pos[r] < len(lists[r]) for r in range(len(lists))):
        progressed = False
        for r, actions in enumerate(lists):
            while pos[r] < len(actions):
                a = actions[pos[r]]
                if a.kind in RECVS and message(a) not in sent:
                    break
                missing = [n for n in _needs(a, p, num_stages) if n not in done[r]]
                if missing:
                    raise ScheduleError(f"rank {r}: {a} needs "
                                        f"{missing[0]}, which no earlier action of rank {r} "
                                        "provides")
                if a.kind in SENDS:
                    sent.add(message(a))
                done[r].add(a)
                rounds[r][pos[r]] = clock
                pos[r] += 1
                progressed = True
                if a.kind in RECVS:  # a received message lets its peer go on first
                    break
        if not progressed:
            raise ScheduleError("deadlock: " + "; ".join(_blocked(lists, pos, p)))
        clock += 1
    return rounds


def _blocked(lists, pos, p) -> list[str]:
    out = []
    for r, actions in enumerate(lists):
        if pos[r] < len(actions):
            a = actions[pos[r]]
            frm = stage_rank(peer_stage(a), p)
            out.append(f"rank {r} waits in {a} for rank {frm}, "
                       f"which waits in {lists[frm][pos[frm]] if pos[frm] < len(lists[frm]) else 'nothing'}")
    return out


def check(lists: list[list[Action]], num_stages: int, microbatches: int) -> list[list[int]]:
    """Raises ScheduleError if the per-rank action lists would fail or hang."""
    p = len(lists)
    if p < 1 or num_stages % p:
        raise ScheduleError(f"{num_stages} stages cannot be spread evenly over {p} ranks")
    _check_messages(lists, p, num_stages)
    _check_compute(lists, p, num_stages, microbatches)
    return _simulate(lists, p, num_stages)

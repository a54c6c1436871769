"""The actions a pipeline rank runs, and where stages live.

A schedule is data: for every rank of the pipeline (its position in the
pipeline's process set, 0..p-1), the list of actions it runs in one step:

* ``F`` / ``B``: forward / backward of ``stage`` on ``microbatch``;
* ``SEND_F``: send stage's output (activation) to the rank of stage+1;
  ``RECV_F``: receive stage's input from the rank of stage-1;
* ``SEND_B``: send the gradient of stage's input to the rank of stage-1;
  ``RECV_B``: receive the gradient of stage's output from the rank of stage+1.

Stage ``s`` of ``num_stages`` lives on pipeline rank ``s % p`` (with one
stage per rank, stage s on rank s; interleaved schedules give rank r the
stages r, r+p, r+2p, ...). Sends are asynchronous (they never block a rank);
a receive waits for its send.
"""
from __future__ import annotations

from typing import NamedTuple

COMPUTE = ("F", "B")
SENDS = ("SEND_F", "SEND_B")
RECVS = ("RECV_F", "RECV_B")
KINDS = COMPUTE + SENDS + RECVS

# Pipeline messages use tags above this base (and below commlib's gradient
# tags, 2**62), so they never meet a user's own messages with small tags.
TAG_BASE = 1 << 40
MAX_MICROBATCHES = 1 << 20


class Action(NamedTuple):
    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}(stage {self.stage}, microbatch {self.microbatch})"


def stage_rank(stage: int, p: int) -> int:
    """The pipeline rank that holds ``stage``."""
    return stage % p


def peer_stage(action: Action) -> int:
    """The stage at the other end of a send or receive."""
    if action.kind in ("SEND_F", "RECV_B"):
        return action.stage + 1
    if action.kind in ("RECV_F", "SEND_B"):
        return action.stage - 1
    raise ValueError(f"{action} is not a send or a receive")


def message(action: Action) -> tuple[str, int, int]:
    """The message a send or receive moves: (direction, sending stage,
    microbatch); a send and the receive that takes it have the same one."""
    if action.kind in ("SEND_F", "SEND_B"):
        return action.kind[-1], action.stage, action.microbatch
    return action.kind[-1], peer_stage(action), action.microbatch


def tag(action: Action) -> int:
    """The point-to-point tag of a send or receive (the same on both ends)."""
    direction, stage, mb = message(action)
    return TAG_BASE + ((stage * 2 + (direction == "B")) * MAX_MICROBATCHES + mb)


def with_messages(compute: list[Action], me: int, p: int, num_stages: int) -> list[Action]:
    """Pipeline rank ``me``'s compute actions with the sends and receives
    they need: a receive right before the compute that uses its data, a send
    right after the compute that produces it. Neighbouring stages on the same
    rank (p == 1) pass tensors without messages."""
    out: list[Action] = []
    for a in compute:
        s, i = a.stage, a.microbatch
        if a.kind == "F":
            if s > 0 and stage_rank(s - 1, p) != me:
                out.append(Action("RECV_F", s, i))
            out.append(a)
            if s < num_stages - 1 and stage_rank(s + 1, p) != me:
                out.append(Action("SEND_F", s, i))
        else:
            if s < num_stages - 1 and stage_rank(s + 1, p) != me:
                out.append(Action("RECV_B", s, i))
            out.append(a)
            if s > 0 and stage_rank(s - 1, p) != me:
                out.append(Action("SEND_B", s, i))
    return out

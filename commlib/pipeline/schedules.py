"""Pipeline schedules as data: every rank's action list for one step.

    from commlib.pipeline.schedules import build
    lists = build("1F1B", p=4, stages_per_rank=1, microbatches=8)   # lists[r]: rank r's actions

``GPipe``: every forward, then every backward (all m activations live).
``1F1B``: rank r runs p-r-1 warm-up forwards, then alternates one forward
and one backward, then drains the backwards (at most p-r activations live).
``Interleaved1F1B``: v stages per rank (stage r + k*p on rank r), 1F1B over
the m*v (stage, microbatch) pairs taken p microbatches at a time, so the
bubble shrinks by v; m must be a multiple of p.
"""
from __future__ import annotations

from .actions import Action, with_messages

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B")


def _gpipe(me: int, p: int, v: int, m: int) -> list[Action]:
    local = [me + k * p for k in range(v)]
    fwd = [Action("F", s, i) for s in local for i in range(m)]
    bwd = [Action("B", s, i) for s in reversed(local) for i in range(m)]
    return fwd + bwd


def _one_f_one_b(forwards: list[Action], backwards: list[Action], warmup: int) -> list[Action]:
    total = len(forwards)
    warmup = min(warmup, total)
    out = forwards[:warmup]
    for k in range(total - warmup):
        out += [forwards[warmup + k], backwards[k]]
    return out + backwards[total - warmup:]


def _interleaved(me: int, p: int, v: int, m: int) -> list[Action]:
    def unit(k: int, backward: bool) -> Action:
        chunk = (k // p) % v
        if backward:
            chunk = v - 1 - chunk
        mb = (k // (p * v)) * p + k % p
        return Action("B" if backward else "F", chunk * p + me, mb)

    total = m * v
    forwards = [unit(k, False) for k in range(total)]
    backwards = [unit(k, True) for k in range(total)]
    return _one_f_one_b(forwards, backwards, (p - me - 1) * 2 + (v - 1) * p)


def compute_order(name: str, me: int, p: int, v: int, m: int) -> list[Action]:
    """Pipeline rank ``me``'s forwards and backwards, in the order it runs them."""
    if name == "GPipe":
        return _gpipe(me, p, v, m)
    if name == "1F1B":
        forwards = [Action("F", me, i) for i in range(m)]
        backwards = [Action("B", me, i) for i in range(m)]
        return _one_f_one_b(forwards, backwards, p - me - 1)
    if name == "Interleaved1F1B":
        return _interleaved(me, p, v, m)
    raise ValueError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")


def check_shape(name: str, p: int, v: int, m: int) -> None:
    """ValueError for a pipeline shape the schedule does not support."""
    if p < 1 or v < 1:
        raise ValueError(f"a pipeline needs at least one rank and one stage per rank, got "
                         f"{p} ranks and {v} stages per rank")
    if m < 1:
        raise ValueError(f"n_microbatches must be at least 1, got {m}")
    if name in ("GPipe", "1F1B") and v != 1:
        raise ValueError(f"{name} runs one stage per rank, got {v}; use Interleaved1F1B for "
                         "several stages per rank")
    if name == "Interleaved1F1B" and m % p:
        raise ValueError(f"Interleaved1F1B needs n_microbatches ({m}) to be a multiple of the "
                         f"number of pipeline ranks ({p})")


def build(name: str, p: int, stages_per_rank: int, microbatches: int) -> list[list[Action]]:
    """Every pipeline rank's action list (sends and receives included)."""
    v, m = stages_per_rank, microbatches
    check_shape(name, p, v, m)
    return [with_messages(compute_order(name, r, p, v, m), r, p, p * v) for r in range(p)]

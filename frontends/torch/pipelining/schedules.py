"""Pipeline schedules on PipelineStages: GPipe, 1F1B, interleaved 1F1B.

    stage = PipelineStage(part_of_model, stage_index=hvd.rank(), num_stages=hvd.size())
    schedule = Schedule1F1B(stage, n_microbatches=8, loss_fn=torch.nn.functional.mse_loss)
    for x, y in data:
        opt.zero_grad()
        losses = []
        out = schedule.step(x, target=y, losses=losses)   # the last stage's output, else None
        opt.step()

Every rank of the pipeline calls ``step`` (the first stage's rank with the
batch, the last stage's rank with ``target``; other ranks' arguments are
not used). The batch is split into ``n_microbatches`` along dimension 0;
each microbatch's loss is scaled by 1/n_microbatches before backward, so
with a mean-reduced loss and equal microbatches the gradients are those of
the whole batch. Gradients accumulate into the parameters (call
``zero_grad`` yourself).

The schedule is data: ``schedule.actions[r]`` is pipeline rank r's list of
actions (commlib.pipeline); all ranks' lists are checked by simulation when
the schedule is built, so a broken one raises ScheduleError naming the rank,
action and microbatch instead of hanging. Microbatch shapes may change from
step to step: receivers learn each message's shape.

``schedule.stats`` holds the last step's times (compute, communication,
step) and each local stage's peak number of live activations; with
``schedule.record_timeline = True`` also ``stats["timeline"]``, every
action's start and end (see commlib.pipeline.timeline, which splits the
time in send/recv into moving messages and waiting for the peer).

Every receive of a step is posted when the step starts (each message has
its own tag), so messages move while the rank computes; a RECV action waits
for its message (``schedule.post_receives_early = False``: each receive is
posted by its RECV action, as the lists read). A step that raises midway
leaves its posted receives behind, and they would take the next step's
messages of the same tags: after such an error, end the job (or
shutdown/init, as elastic training does) rather than stepping again.
"""
from __future__ import annotations

import time

import torch

from commlib.pipeline.actions import COMPUTE, RECVS, Action, peer_stage, tag
from commlib.pipeline.checker import check
from commlib.pipeline.schedules import build

from ..mpi_ops import synchronize
from ..collectives.p2p import irecv, isend
from .stage import PipelineStage


def _split(tensors: tuple, m: int, what: str) -> list[tuple]:
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            raise TypeError(f"{what} must be tensors with a batch dimension")
        if t.shape[0] < m:
            raise ValueError(f"{what}: a batch of {t.shape[0]} rows cannot be split into "
                             f"{m} microbatches")
    parts = [torch.tensor_split(t, m, dim=0) for t in tensors]
    return [tuple(p[i] for p in parts) for i in range(m)]


class _Schedule:
    _name = ""

    def __init__(self, stages, n_microbatches: int, loss_fn, actions=None):
        stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]
        if not stages or not all(isinstance(s, PipelineStage) for s in stages):
            raise TypeError(f"{type(self).__name__} needs PipelineStage objects")
        first = stages[0]
        if any(s.num_stages != first.num_stages or s.group != first.group for s in stages):
            raise ValueError("the stages of one schedule must share num_stages and process_set")
        if loss_fn is None or not callable(loss_fn):
            raise TypeError(f"{type(self).__name__} needs a loss_fn(output, target)")
        p = first.pipeline_size
        me = first.stage_index % p
        v = first.num_stages // p
        mine = sorted(s.stage_index for s in stages)
        if mine != [me + k * p for k in range(v)]:
            raise ValueError(f"pipeline rank {me} must hold stages {[me + k * p for k in range(v)]}"
                             f" (every one of its stages), got {mine}")
        if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int):
            raise TypeError(f"n_microbatches must be an int, got {type(n_microbatches).__name__}")
        if actions is None:
            actions = build(self._name, p, v, n_microbatches)
        elif len(actions) != p:
            raise ValueError(f"actions needs one list per pipeline rank ({p}), got {len(actions)}")
        self.actions = [[Action(*a) for a in rank_actions] for rank_actions in actions]
        check(self.actions, first.num_stages, n_microbatches)
        self.stages = {s.stage_index: s for s in stages}
        self.n_microbatches, self.loss_fn, self._me = n_microbatches, loss_fn, me
        self.stats: dict = {}
        self.record_timeline = False
        self.post_receives_early = True

    # ---------------------------------------------------------- one step
    def step(self, *inputs, target=None, losses=None):
        """Runs one step: every local stage's forward and backward on every
        microbatch. Returns the last stage's output (the microbatches'
        outputs concatenated) on the rank that holds it, else None; appends
        each microbatch's loss (unscaled, detached) to ``losses`` there."""
        m = self.n_microbatches
        has_first = 0 in self.stages
        last = self._any_stage().num_stages - 1
        micro = _split(inputs, m, "step's inputs") if has_first else None
        targets = None
        if last in self.stages:
            if target is None:
                raise ValueError("step needs target= on the rank that holds the last stage")
            targets = [t[0] for t in _split((target,), m, "target")]
        run = _Run(self, micro, targets)
        t0 = time.perf_counter()
        for a in self.actions[self._me]:
            run.do(a)
        run.finish_sends()
        self.stats = run.stats(time.perf_counter() - t0)
        if last not in self.stages:
            return None
        stage = self.stages[last]
        if losses is not None:
            losses.extend(stage.losses[i].detach() for i in range(m))
        out = torch.cat([run.outputs[i] for i in range(m)])
        for s in self.stages.values():
            s.clear()
        return out

    def _any_stage(self) -> PipelineStage:
        return next(iter(self.stages.values()))


class _Run:
    """The state of one step on one rank: the receives posted, the sends in
    flight, the time spent computing and communicating (and, when the
    schedule records a timeline, every action's start and end)."""

    def __init__(self, schedule: _Schedule, micro, targets):
        self.s, self.micro, self.targets = schedule, micro, targets
        self.received: dict[tuple, torch.Tensor] = {}
        self.sends: list = []
        self.outputs: dict[int, torch.Tensor] = {}
        self.compute = self.comm = 0.0
        self.events = [] if schedule.record_timeline else None
        for st in schedule.stages.values():
            st.clear()
            st.live_peak = 0
        self._post_receives(schedule.actions[schedule._me])

    def _post_receives(self, actions) -> None:
        """Posts every receive of the step at once (each message has its own
        tag), so that a message moves while this rank computes; the RECV
        actions only wait for them."""
        self.pending: dict | None = None
        if not self.s.post_receives_early:
            return
        t0 = time.perf_counter()
        self.pending = {a: self._post(a) for a in actions if a.kind in RECVS}
        self._spent("POST", t0, -1, -1)

    def _post(self, a: Action):
        st = self.s.stages[a.stage]
        return irecv(st.job_rank(peer_stage(a)), tag(a), process_set=st.process_set, device=st.device)

    def _receive(self, a: Action) -> torch.Tensor:
        return synchronize(self.pending.pop(a) if self.pending is not None else self._post(a))

    def do(self, a: Action) -> None:
        t0 = time.perf_counter()
        getattr(self, "_" + a.kind)(self.s.stages[a.stage], a)
        self._spent(a.kind, t0, a.stage, a.microbatch)

    def _spent(self, kind: str, t0: float, stage: int, microbatch: int) -> None:
        t1 = time.perf_counter()
        if kind in COMPUTE:
            self.compute += t1 - t0
        else:
            self.comm += t1 - t0
        if self.events is not None:
            self.events.append((kind, stage, microbatch, t0, t1))

    def _F(self, st: PipelineStage, a: Action) -> None:
        i = a.microbatch
        if st.is_first:
            inputs = self.micro[i]
        elif ("F", a.stage, i) in self.received:
            inputs = (self.received.pop(("F", a.stage, i)),)
        else:  # the previous stage runs on this rank (a pipeline of one rank)
            prev = self.s.stages[a.stage - 1].outputs[i]
            inputs = (prev.detach().requires_grad_(prev.requires_grad),)
        target = self.targets[i] if st.is_last else None
        out = st.forward(i, inputs, target, self.s.loss_fn)
        if st.is_last:
            self.outputs[i] = out.detach()

    def _B(self, st: PipelineStage, a: Action) -> None:
        i = a.microbatch
        grad = None
        if not st.is_last:
            grad = self.received.pop(("B", a.stage, i), None)
            if grad is None:  # the next stage runs on this rank
                grad = self.s.stages[a.stage + 1].input_grads.pop(i)
        st.backward(i, grad, 1.0 / self.s.n_microbatches)

    def _SEND_F(self, st: PipelineStage, a: Action) -> None:
        out = st.outputs[a.microbatch].detach()
        self.sends.append(isend(out, st.job_rank(a.stage + 1), tag(a), st.process_set))

    def _SEND_B(self, st: PipelineStage, a: Action) -> None:
        g = st.input_grads.pop(a.microbatch)
        self.sends.append(isend(g, st.job_rank(a.stage - 1), tag(a), st.process_set))

    def _RECV_F(self, st: PipelineStage, a: Action) -> None:
        x = self._receive(a)
        if x.is_floating_point():
            x.requires_grad_(True)
        self.received[("F", a.stage, a.microbatch)] = x

    def _RECV_B(self, st: PipelineStage, a: Action) -> None:
        self.received[("B", a.stage, a.microbatch)] = self._receive(a)

    def finish_sends(self) -> None:
        t0 = time.perf_counter()
        for h in self.sends:
            synchronize(h)
        self.sends = []
        self._spent("FINISH", t0, -1, -1)

    def stats(self, total: float) -> dict:
        out = {"step_s": total, "compute_s": self.compute, "comm_s": self.comm,
               "live_peak": {s: st.live_peak for s, st in self.s.stages.items()}}
        if self.events is not None:
            out["timeline"] = self.events
        return out


class ScheduleGPipe(_Schedule):
    """Every microbatch forward, then every microbatch backward."""
    _name = "GPipe"


class Schedule1F1B(_Schedule):
    """One forward, one backward: at most p - r activations live on rank r."""
    _name = "1F1B"


class ScheduleFromActions(_Schedule):
    """A schedule of your own: ``actions[r]`` is pipeline rank r's list of
    ``commlib.pipeline.actions.Action`` (or (kind, stage, microbatch)
    tuples), the same on every rank; it is checked like the built ones."""

    def __init__(self, stages, n_microbatches: int, loss_fn, actions):
        super().__init__(stages, n_microbatches, loss_fn, actions)


class ScheduleInterleaved1F1B(_Schedule):
    """1F1B over several stages per rank (``stages``: this rank's stages
    r, r+p, ...); n_microbatches must be a multiple of p."""
    _name = "Interleaved1F1B"

"""commlib.torch.pipelining on every rank: GPipe, 1F1B and interleaved 1F1B
with 4 and 8 microbatches train a Tanh MLP (8 modules split into p or 2p
stages) for 10 SGD steps whose batch size changes from step to step, and
end where one process trained on the whole batches ends; losses and outputs
match too; 1F1B keeps at most p-r activations live; a broken schedule of
one's own raises ScheduleError on every rank before anything is sent; a
one-rank pipeline (process set of one) passes tensors between its stages;
the opt-in timeline lists every action and splits the time in send/recv
(commlib.pipeline.timeline) consistently with ``stats``; receives posted
at their RECV actions instead of the step's start give the same gradients."""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import check_equal, done, expect_raises, fail
from commlib.pipeline import timeline
from commlib.torch.pipelining import (Action, PipelineStage, Schedule1F1B, ScheduleError,
                                      ScheduleFromActions, ScheduleGPipe,
                                      ScheduleInterleaved1F1B)

torch.set_num_threads(1)
hvd.init()
r, p = hvd.rank(), hvd.size()
STEPS, LR = 10, 0.1
DTYPE = torch.float64 if "--double" in sys.argv else torch.float32
MICROBATCHES = (4,) if "--quick" in sys.argv else (4, 8)


def modules(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(),
                         nn.Linear(24, 16), nn.Tanh(), nn.Linear(16, 3), nn.Tanh()).to(DTYPE)


def batch(step):
    rows = (16, 24, 8, 32)[step % 4]  # shapes change from step to step
    g = torch.Generator().manual_seed(500 + step)
    return (torch.randn(rows, 12, generator=g, dtype=DTYPE),
            torch.randn(rows, 3, generator=g, dtype=DTYPE))


def reference():
    model = modules()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, outs = [], []
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        out = model(x)
        loss = F.mse_loss(out, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        outs.append(out.detach())
    return model, losses, outs


REF, REF_LOSSES, REF_OUTS = reference()


def stage_modules(model, num_stages, stage):
    per = len(model) // num_stages
    return model[stage * per:(stage + 1) * per]


def rel_err(a_params, b_params):
    worst = 0.0
    for a, b in zip(a_params, b_params):
        worst = max(worst, float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)))
    return worst


def train(schedule_cls, m, v, process_set=None):
    pp = p if process_set is None else process_set.size()
    me = r if process_set is None else process_set.rank()
    num_stages = pp * v
    model = modules()
    stages = [PipelineStage(stage_modules(model, num_stages, s), s, num_stages, process_set)
              for s in range(me, num_stages, pp)]
    params = [q for st in stages for q in st.module.parameters()]
    opt = torch.optim.SGD(params or [torch.zeros(1, requires_grad=True)], lr=LR)  # Tanh-only ranks
    sched = schedule_cls(stages if v > 1 else stages[0], m, F.mse_loss)
    worst_loss = 0.0
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        losses = []
        out = sched.step(x, target=y, losses=losses)
        opt.step()
        if (num_stages - 1) in sched.stages:
            check_equal(out.numpy(), REF_OUTS[step].numpy(), f"{schedule_cls.__name__} output",
                        rtol=1e-5, atol=1e-6)
            mean_loss = float(sum(losses) / len(losses))
            worst_loss = max(worst_loss, abs(mean_loss - REF_LOSSES[step]) / REF_LOSSES[step])
        elif out is not None:
            fail("step must return None where the last stage is not")
    ref_params = [q for st in stages for q in stage_modules(REF, num_stages, st.stage_index).parameters()]
    return rel_err(params, ref_params), worst_loss, sched


worst = 0.0
for cls, v in ((ScheduleGPipe, 1), (Schedule1F1B, 1), (ScheduleInterleaved1F1B, 2)):
    for m in MICROBATCHES:
        err, loss_err, sched = train(cls, m, v)
        worst = max(worst, err)
        if err > 1e-5 or loss_err > 1e-5:
            fail(f"{cls.__name__} m={m}: parameter error {err:.2e}, loss error {loss_err:.2e}")
        peak = max(sched.stats["live_peak"].values())
        if cls is Schedule1F1B and peak > p - r:
            fail(f"1F1B kept {peak} activations live on rank {r} (at most {p - r})")
        if cls is ScheduleGPipe and peak != m:
            fail(f"GPipe kept {peak} activations live, expected {m}")
        errs = hvd.allgather(torch.tensor([err], dtype=torch.float64))
        if r == 0:
            print(f"{cls.__name__} p={p} m={m} {DTYPE}: max relative parameter error "
                  f"{float(errs.max()):.2e}", flush=True)

# ---- the opt-in timeline; receives posted by their RECV actions give the same gradients
def one_step(early, record):
    st = PipelineStage(stage_modules(modules(), p, r), r, p)
    sched = Schedule1F1B(st, 4, F.mse_loss)
    sched.record_timeline, sched.post_receives_early = record, early
    x, y = batch(1)
    sched.step(x, target=y)
    return sched, [q.grad for q in st.module.parameters()]


plain, grads = one_step(True, False)
if "timeline" in plain.stats:
    fail("a schedule records a timeline only when asked")
for early in (True, False):
    sched, g = one_step(early, True)
    if any(not torch.equal(a, b) for a, b in zip(g, grads)):
        fail(f"post_receives_early={early}: gradients differ from the default schedule's")
    events = sched.stats["timeline"]
    want = [a.kind for a in sched.actions[r]] + ["FINISH"]
    if [e[0] for e in events] != (["POST"] if early else []) + want:
        fail(f"timeline kinds {[e[0] for e in events]}, expected the actions in order")
    rows = torch.tensor(timeline.encode(events), dtype=torch.float64)
    counts = hvd.allgather(torch.tensor([rows.shape[0]])).tolist()
    every = [timeline.decode(t.tolist()) for t in hvd.allgather(rows).split(counts)]
    mine = timeline.p2p_seconds(every)[r]
    if not (0 <= mine["p2p"] <= mine["calls"] and mine["compute"] + mine["calls"] <= mine["step"]
            and abs(mine["calls"] - sched.stats["comm_s"]) < 1e-9):
        fail(f"timeline split {mine} against stats {sched.stats}")

# ---- a schedule of one's own that would hang raises on every rank, before anything is sent
model = modules()
stage = PipelineStage(stage_modules(model, p, r), r, p)
lists = [list(a) for a in Schedule1F1B(stage, 4, F.mse_loss).actions]
lists[1].remove(Action("RECV_F", 1, 2))
e = expect_raises(ScheduleError, lambda: ScheduleFromActions(stage, 4, F.mse_loss, lists),
                  "unmatched send")
if "rank 0: SEND_F(stage 0, microbatch 2) to rank 1 has no matching receive" not in str(e):
    fail(f"ScheduleError message: {e}")
lists = [list(a) for a in ScheduleGPipe(stage, 4, F.mse_loss).actions]
lists[0].remove(Action("RECV_B", 0, 0))
lists[0].insert(lists[0].index(Action("SEND_F", 0, 0)), Action("RECV_B", 0, 0))
expect_raises(ScheduleError, lambda: ScheduleFromActions(stage, 4, F.mse_loss, lists),
              "cycle", "deadlock: rank 0 waits in RECV_B(stage 0, microbatch 0) for rank 1")

# ---- argument errors, raised on every rank before anything is sent
expect_raises(ValueError, lambda: PipelineStage(stage.module, (r + 1) % p, p), "wrong stage",
              f"this is pipeline rank {r}")
expect_raises(ValueError, lambda: PipelineStage(stage.module, r, p + 1), "uneven stages",
              "spread evenly")
expect_raises(ValueError, lambda: Schedule1F1B(stage, 0, F.mse_loss), "no microbatches",
              "at least 1")
s2 = [PipelineStage(nn.Identity(), s, 2 * p) for s in (r, r + p)]
expect_raises(ValueError, lambda: ScheduleInterleaved1F1B(s2, p + 1, F.mse_loss),
              "interleaved m", "multiple of the number of pipeline ranks")
expect_raises(ValueError, lambda: ScheduleInterleaved1F1B(s2[:1], p, F.mse_loss),
              "missing local stage", "must hold stages")
expect_raises(TypeError, lambda: ScheduleGPipe(stage, 4, None), "no loss", "loss_fn")
sched = ScheduleGPipe(stage, 4, F.mse_loss)
if r in (0, p - 1):  # the ranks that hold the batch or the target check it before sending
    expect_raises(ValueError, lambda: sched.step(torch.ones(3, 12, dtype=DTYPE),
                                             target=torch.ones(3, 3, dtype=DTYPE)),
                  "batch < microbatches", "cannot be split into 4 microbatches")

# ---- a pipeline of one rank: every stage here, tensors passed without messages
solo = [hvd.add_process_set([k]) for k in range(p)][r]
err, loss_err, _ = train(ScheduleInterleaved1F1B, 4, 4, process_set=solo)
if err > 1e-5 or loss_err > 1e-5:
    fail(f"one-rank pipeline: parameter error {err:.2e}, loss error {loss_err:.2e}")
hvd.barrier()
done()

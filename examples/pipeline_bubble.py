"""Pipeline bubble and point-to-point cost of commlib.torch.pipelining.

    commlibrun -np 4 python examples/pipeline_bubble.py --microbatches 4 8
    commlibrun -np 2 python examples/pipeline_bubble.py --act-mib 1

Every stage costs the same fixed time (a sleep of --forward-ms in forward
and twice that in backward, split over the stages a rank holds), so a rank's
idle fraction can be compared with the formula: (p-1)/(m+p-1) for GPipe and
1F1B, (p-1)/(v*m+p-1) for interleaved 1F1B with v stages per rank (what its
lists give with free messages; about (p-1)/(v*m)). The target column is the
issue's: within 0.05 of the formula for GPipe and 1F1B, below GPipe's
(p-1)/(m+p-1) for interleaved 1F1B. Idle =
1 - compute/step on each rank (averaged over ranks and steps after a
warm-up). Activations are --act-mib MiB per microbatch; "excess" is the
step time beyond the ideal ((v*m+p-1)/v stage slots of tf+tb): what is neither compute
nor bubble (the sends and receives, the elementwise work on the activations,
the schedule's Python). "in send/recv calls" is the share of the step inside
the schedule's send/recv calls, waits for a peer still computing included;
"moving messages" leaves those waits out (commlib.pipeline.timeline: a wait
counts only from the moment the sender posted the message): the cost of the
point-to-point traffic itself (mean over ranks, and the largest rank's).
"""
import argparse
import time

import torch

import commlib.torch as hvd
from commlib.pipeline import timeline
from commlib.torch.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                      ScheduleInterleaved1F1B)


class _Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fwd_s, bwd_s):
        ctx.bwd_s = bwd_s
        time.sleep(fwd_s)
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.bwd_s)
        return g, None, None


class FixedCost(torch.nn.Module):
    def __init__(self, fwd_s):
        super().__init__()
        self.fwd_s = fwd_s
        self.w = torch.nn.Parameter(torch.ones(()))

    def forward(self, x):
        return _Sleep.apply(x * self.w, self.fwd_s, 2 * self.fwd_s)


def p2p_share(sched) -> float:
    """This rank's share of the last step spent moving messages: time inside
    send/recv calls less the waits for a peer that had not sent yet (from
    every rank's timeline, gathered)."""
    rows = torch.tensor(timeline.encode(sched.stats["timeline"]), dtype=torch.float64)
    counts = hvd.allgather(torch.tensor([rows.shape[0]]))
    every = hvd.allgather(rows).split(counts.tolist())
    mine = timeline.p2p_seconds([timeline.decode(t.tolist()) for t in every])[hvd.rank()]
    return mine["p2p"] / mine["step"]


def measure(cls, v, m, args):
    p, r = hvd.size(), hvd.rank()
    tf = args.forward_ms / 1000 / v
    stages = [PipelineStage(FixedCost(tf), s, p * v) for s in range(r, p * v, p)]
    sched = cls(stages if v > 1 else stages[0], m, lambda out, y: (out - y).pow(2).mean())
    sched.record_timeline = True
    sched.post_receives_early = not args.late_receives
    cols = max(1, int(args.act_mib * (1 << 20) / 4 / args.rows))
    x, y = torch.randn(m * args.rows, cols), torch.randn(m * args.rows, cols)
    idle, excess, calls, moving, peak = [], [], [], [], 0
    for step in range(args.steps + 1):
        sched.step(x, target=y)
        st = sched.stats
        if step == 0:
            continue  # warm-up
        idle.append(1 - st["compute_s"] / st["step_s"])
        ideal = (v * m + p - 1) * 3 * args.forward_ms / 1000 / v
        excess.append(max(0.0, st["step_s"] - ideal) / st["step_s"])
        calls.append(st["comm_s"] / st["step_s"])
        moving.append(p2p_share(sched))
        peak = max(peak, max(st["live_peak"].values()))
    mean = torch.tensor([[sum(c) / len(c) for c in (idle, excess, calls, moving)] + [float(peak)]],
                        dtype=torch.float64)
    every = hvd.allgather(mean)
    return {"idle": every[:, 0].mean().item(), "excess": every[:, 1].max().item(),
            "calls": every[:, 2].mean().item(), "moving": every[:, 3].mean().item(),
            "moving_max": every[:, 3].max().item(), "peak": int(every[:, 4].max().item())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--microbatches", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--forward-ms", type=float, default=10.0)
    ap.add_argument("--act-mib", type=float, default=0.0625)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--late-receives", action="store_true",
                    help="post each receive at its RECV action, not all at the step's start")
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    p = hvd.size()
    if hvd.rank() == 0:
        print(f"p={p}, stage cost {args.forward_ms} ms forward + {2 * args.forward_ms} ms "
              f"backward, activations {args.act_mib} MiB per microbatch")
        print("| schedule | m | measured idle | formula | target | excess over ideal "
              "| in send/recv calls | moving messages (mean, max rank) | peak live activations |")
        print("|---|---|---|---|---|---|---|---|---|")
    for m in args.microbatches:
        for cls, v in ((ScheduleGPipe, 1), (Schedule1F1B, 1), (ScheduleInterleaved1F1B, 2)):
            if m % p and v > 1:
                continue
            res = measure(cls, v, m, args)
            formula = (p - 1) / (v * m + p - 1)
            if v == 1:
                target, met = f"{formula:.3f} ± 0.05", abs(res["idle"] - formula) <= 0.05
            else:
                bound = (p - 1) / (m + p - 1)
                target, met = f"< {bound:.3f}", res["idle"] < bound
            if hvd.rank() == 0:
                print(f"| {cls.__name__} | {m} | {res['idle']:.3f} | {formula:.3f} | {target} "
                      f"({'met' if met else 'missed'}) | {res['excess']:.3f} | {res['calls']:.3f} "
                      f"| {res['moving']:.3f}, {res['moving_max']:.3f} | {res['peak']} |",
                      flush=True)


if __name__ == "__main__":
    main()

"""DistributedOptimizer(zero_stage=1|2) on every rank: 20 Adam steps (param
groups, an LR scheduler, uneven shards over several buckets) against the
unsharded DistributedOptimizer and one process on the combined batch;
gradient accumulation, clipping, a parameter unused on one rank, state_dict
round trips, process sets, memory_report, errors."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import check_equal, done, expect_raises, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
B, STEPS = 6, 20
worst = {1: 0.0, 2: 0.0}  # largest relative error against unsharded, per stage


class Net(nn.Module):
    """An MLP with a head that only rank 0 uses when ``lonely`` is set."""

    def __init__(self, seed=0, lonely=False):
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(10, 33), nn.Tanh(), nn.Linear(33, 17), nn.Tanh())
        self.out = nn.Linear(17, 4)
        self.extra = nn.Linear(17, 4) if lonely else None

    def forward(self, x):
        h = self.body(x)
        y = self.out(h)
        return y + self.extra(h) if self.extra is not None and r == 0 else y


def batch(step, rows):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(rows, 10, generator=g), torch.randint(0, 4, (rows,), generator=g)


def adam(model, lr=1e-2):
    return torch.optim.Adam([{"params": model.body.parameters(), "weight_decay": 0.01},
                             {"params": [p for n_, p in model.named_parameters()
                                         if not n_.startswith("body")], "lr": lr / 2}], lr=lr)


def train(stage, steps=STEPS, passes=1, clip=None, lonely=False, ps=hvd.global_process_set,
          model=None, opt=None, start=0, local=False):
    """Trains on this rank's part of each step's batch (the whole batch with
    local=True: one process); returns (model, optimizer)."""
    if model is None:
        model = Net(lonely=lonely)
        opt = adam(model)
        if not local:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                           zero_stage=stage, bucket_elements=200,
                                           backward_passes_per_step=passes,
                                           process_set=ps) if stage else \
                hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes, process_set=ps)
    # the learning rate halves every 7 steps, counted from the first step of the run
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** ((s + start) // 7))
    members = ps.ranks if ps.ranks else list(range(n))
    k, me = len(members), members.index(r) if r in members else 0
    for step in range(start, start + steps):
        x, y = batch(step, k * B)
        if not local:
            x, y = x[me * B:(me + 1) * B], y[me * B:(me + 1) * B]
        opt.zero_grad()
        for part in range(passes):
            sl = slice(part * len(x) // passes, (part + 1) * len(x) // passes)
            (F.cross_entropy(model(x[sl]), y[sl]) / passes).backward()
        if clip is None:
            opt.step()
        else:
            if not local:
                opt.synchronize()
            if stage == 2:
                norm = opt.clip_grad_norm_(clip)
            else:
                norm = nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.last_norm = float(norm)
            with opt.skip_synchronize() if not local else _nothing():
                opt.step()
        sched.step()
    return model, opt


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def rel_err(a, b):
    return max(float((p - q).detach().abs().max() / q.detach().abs().max())
               for p, q in zip(a.parameters(), b.parameters()))


def same_on_all_ranks(model, what, ps=hvd.global_process_set):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.unsqueeze(0), name=f"same.{what}", process_set=ps)
    for i in range(every.shape[0]):
        if not torch.equal(every[i], flat):
            fail(f"{what}: parameters differ between rank {r} and position {i}")


def compare(stage, what, tol=1e-5, **kw):
    model, opt = train(stage, **kw)
    ref, _ = train(0, **kw)
    err = rel_err(model, ref)
    worst[stage] = max(worst[stage], err)
    if err > tol:
        fail(f"stage {stage} {what}: relative error {err:.3g} against unsharded > {tol}")
    same_on_all_ranks(model, f"{what}.{stage}")
    return model, opt, ref


def check_training():
    for stage in (1, 2):
        model, opt, _ = compare(stage, "adam")
        one, _ = train(0, local=True)
        if rel_err(model, one) > 1e-4:
            fail(f"stage {stage}: {rel_err(model, one):.3g} from one process on the whole batch")
        if len(opt._buckets) < 3 or not any(b.plan.numel % n for b in opt._buckets if n > 1):
            fail(f"the test should cover several buckets and uneven shards: {len(opt._buckets)}")
        compare(stage, "accumulate", passes=2)
        model, opt, _ = compare(stage, "clip", clip=0.5)
        ref, ref_opt = train(0, clip=0.5, steps=1)
        model, opt = train(stage, clip=0.5, steps=1)
        if abs(opt.last_norm - ref_opt.last_norm) > 1e-5 * ref_opt.last_norm:
            fail(f"stage {stage}: clip_grad_norm_ {opt.last_norm} != {ref_opt.last_norm}")
        if stage == 2 and any(p.grad is not None for p in model.parameters()):
            fail("stage 2 keeps full gradients after the step")
        compare(stage, "lonely", lonely=True)


def check_state_dicts():
    for stage in (1, 2):
        whole, _ = train(stage)
        model, opt = train(stage, steps=STEPS // 2)
        saved_model = {k: v.clone() for k, v in model.state_dict().items()}
        saved = opt.state_dict()
        model2 = Net()
        opt2 = hvd.DistributedOptimizer(adam(model2), named_parameters=model2.named_parameters(),
                                        zero_stage=stage, bucket_elements=200)
        model2.load_state_dict(saved_model)
        opt2.load_state_dict(saved)
        train(stage, steps=STEPS // 2, model=model2, opt=opt2, start=STEPS // 2)
        # (not bitwise at 3 ranks: how allreduces are fused changes the summation order)
        if rel_err(model2, whole) > 1e-6:
            fail(f"stage {stage}: resumed from state_dict() differs by {rel_err(model2, whole)}")
        # An ordinary torch state dict (unsharded) loads into ZeRO: this rank keeps its part.
        plain, plain_opt = train(0, steps=STEPS // 2)
        model3 = Net()
        opt3 = hvd.DistributedOptimizer(adam(model3), named_parameters=model3.named_parameters(),
                                        zero_stage=stage, bucket_elements=200)
        model3.load_state_dict(plain.state_dict())
        opt3.load_state_dict(plain_opt.state_dict())
        train(stage, steps=STEPS // 2, model=model3, opt=opt3, start=STEPS // 2)
        train(0, steps=STEPS // 2, model=plain, opt=plain_opt, start=STEPS // 2)
        if rel_err(model3, plain) > 1e-5:
            fail(f"stage {stage}: resumed from a torch state dict: {rel_err(model3, plain)}")
        fresh_model = Net()
        fresh = hvd.DistributedOptimizer(adam(fresh_model), zero_stage=stage,
                                         named_parameters=fresh_model.named_parameters())
        fresh.param_groups[1]["lr"] = 0.125 if r == 0 else 1.0
        hvd.broadcast_optimizer_state(fresh, root_rank=0)  # a fresh ZeRO state: hyperparameters
        if fresh.param_groups[1]["lr"] != 0.125:
            fail(f"broadcast_optimizer_state of a fresh ZeRO optimizer: {fresh.param_groups[1]}")
        other = hvd.broadcast_object(saved, root_rank=0, name=f"sd.{stage}")
        if r != 0:
            expect_raises(ValueError, lambda: opt2.load_state_dict(other),
                          "loading another rank's shard", match="save_sharded")


def check_process_set():
    ps = hvd.add_process_set(list(range(0, n, 2)))
    for stage in (1, 2):
        model, opt = train(stage, ps=ps)
        ref, _ = train(0, ps=ps)
        if ps.included() and rel_err(model, ref) > 1e-5:
            fail(f"stage {stage} on {ps}: {rel_err(model, ref)} from unsharded")
        if ps.included():
            same_on_all_ranks(model, f"ps.{stage}", ps)
        elif hasattr(opt, "_buckets") or rel_err(model, ref) > 0:
            fail("a rank outside the set should train locally, unsharded")
    hvd.remove_process_set(ps)


def check_memory():
    torch.manual_seed(1)
    for stage in (0, 1, 2):
        model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256), nn.Linear(256, 250))
        psi = sum(p.numel() for p in model.parameters())
        opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()),
                                       named_parameters=model.named_parameters(),
                                       zero_stage=stage)
        model(torch.randn(4, 256)).sum().backward()
        opt.step()
        rep = hvd.memory_report(model, opt)
        shards = n if stage else 1
        # stage 1: autograd's gradients and the persistent shard gradient the
        # reduce-scatter writes into (stage 2 keeps only the latter)
        want = {"parameters": 4 * psi, "optimizer_state": 8 * psi / shards,
                "gradients": 4 * psi * {0: 1, 1: 1 + 1 / n, 2: 1 / n}[stage]}
        for k, v in want.items():
            if not v <= rep[k] <= 1.05 * v:
                fail(f"stage {stage} memory_report {k} = {rep[k]}, expected about {v:.0f}")
        if rep["total"] != sum(rep[k] for k in want):
            fail(f"memory_report total {rep}")
        print(f"rank {r}: memory stage {stage}: {rep}", flush=True)


def check_errors():
    model = Net()

    def make(**kw):
        return hvd.DistributedOptimizer(adam(model), named_parameters=model.named_parameters(),
                                        **kw)

    expect_raises(ValueError, lambda: make(zero_stage=3), "zero_stage=3", match="zero_stage")
    expect_raises(ValueError, lambda: make(zero_stage=True), "zero_stage=True")
    expect_raises(ValueError, lambda: make(zero_stage=1, bucket_elements=0), "bucket 0")
    expect_raises(ValueError, lambda: make(zero_stage=0, bucket_elements=200), "buckets without ZeRO",
                  match="takes zero_stage=1 or 2")
    expect_raises(ValueError, lambda: make(zero_stage=1, compression=hvd.Compression.fp16),
                  "compression", match="compression")
    expect_raises(ValueError, lambda: make(zero_stage=2, groups=2), "groups", match="groups")
    stepped = adam(model)
    model(torch.randn(2, 10)).sum().backward()
    stepped.step()
    expect_raises(ValueError, lambda: hvd.DistributedOptimizer(
        stepped, named_parameters=model.named_parameters(), zero_stage=1), "stepped optimizer",
        match="not stepped")
    model = Net()
    opt = make(zero_stage=2)
    expect_raises(NotImplementedError, lambda: opt.add_param_group({"params": []}),
                  "add_param_group")
    model(torch.randn(2, 10)).sum().backward()
    expect_raises(AssertionError, opt.zero_grad, "zero_grad in flight", match="race")
    expect_raises(RuntimeError, lambda: opt.clip_grad_norm_(1.0), "clip before synchronize",
                  match="synchronize")
    opt.step()
    # frozen when built, unfrozen later: not sharded, so an error instead of a silent skip
    model = Net()
    model.out.bias.requires_grad_(False)
    opt = make(zero_stage=1)
    model.out.bias.requires_grad_(True)
    model(torch.randn(2, 10)).sum().backward()
    expect_raises(ValueError, opt.step, "unfrozen parameter", match="out.bias")
    opt.zero_grad()
    model.out.bias.grad = None
    # parameters that differ across ranks: a clear error on every rank, no hang
    model = Net(lonely=(r == n - 1))
    e = expect_raises(hvd.CollectiveMismatchError, lambda: make(zero_stage=1),
                      "extra parameter on one rank", match="extra.weight")
    if str(n - 1) not in str(e):
        fail(f"the mismatch error should name rank {n - 1}: {e}")
    model = Net()
    if r == n - 1:
        model.out = nn.Linear(17, 5)
    expect_raises(hvd.CollectiveMismatchError, lambda: make(zero_stage=2), "shape mismatch",
                  match="out.weight")
    model = Net()
    expect_raises(hvd.CollectiveMismatchError, lambda: make(zero_stage=1 if r == 0 else 2),
                  "zero_stage differs", match="ZeRO options")
    expect_raises(hvd.CollectiveMismatchError, lambda: make(zero_stage=1 if r == 0 else 0),
                  "ZeRO on one rank only", match="ZeRO options")


def check_other_optimizers():
    """AdamW (its defaults hold a keyword its constructor does not take) and
    Adagrad (its constructor makes state at step 0) under ZeRO train as the
    unsharded DistributedOptimizer does (both were refused when built)."""
    makers = {"AdamW": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
              "Adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1, initial_accumulator_value=0.1)}
    for what, make in makers.items():
        for stage in (1, 2):
            models = []
            for zero in (stage, 0):
                model = Net()
                opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters(),
                                               zero_stage=zero, bucket_elements=200 if zero else None)
                for step in range(4):
                    x, y = batch(step, n * B)
                    opt.zero_grad()
                    F.cross_entropy(model(x[r * B:(r + 1) * B]), y[r * B:(r + 1) * B]).backward()
                    opt.step()
                models.append(model)
            err = rel_err(*models)
            if err > 1e-5:
                fail(f"{what} stage {stage}: relative error {err:.3g} against unsharded > 1e-5")
            same_on_all_ranks(models[0], f"{what}.{stage}")


def check_join_refused():
    """join() while a ZeRO optimizer lives is refused on the rank that calls
    it, before anything is sent (a joined rank's shard would be missing from
    the other ranks' next step: they failed with a confusing allgather
    error, or waited)."""
    model = Net()
    opt = hvd.DistributedOptimizer(adam(model), named_parameters=model.named_parameters(), zero_stage=1)
    expect_raises(ValueError, hvd.join, "join with a ZeRO optimizer alive", match="zero_stage=1")
    check_equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after.join.refused").numpy(),
                np.full(2, float(n), np.float32), "an allreduce after the refused join")
    del opt, model


check_training()
check_other_optimizers()
check_join_refused()
check_state_dicts()
check_process_set()
check_memory()
check_errors()
print(f"rank {r}: max relative error stage1 {worst[1]:.3g}, stage2 {worst[2]:.3g}", flush=True)
done()

"""A ZeRO optimizer's ``opt.state`` on every rank (stages 1 and 2, Adam,
small buckets so that parameters are split across ranks): state[p] holds
the state of the parameters this rank owns, equal (1e-9, float64) to one process's
Adam on the combined batch (shaped like p when wholly owned, the owned
slice of p.reshape(-1) otherwise; step as one process's); parameters owned
elsewhere are absent; the owned ranges of all ranks cover every element
once; the values are live views (they follow the next step); state_dict()
keeps its shard form. Prints the largest relative error."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd
from _common import done, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
B, STEPS = 4, 3


def net():
    torch.manual_seed(8)
    return nn.Sequential(nn.Linear(7, 9), nn.Tanh(), nn.Linear(9, 5), nn.Tanh(),
                         nn.Linear(5, 2)).double()  # float64: sums in any order agree


def train(model, opt, steps, part):
    for step in range(steps):
        g = torch.Generator().manual_seed(60 + step)
        x = torch.randn(n * B, 7, generator=g, dtype=torch.float64)
        y = torch.randint(0, 2, (n * B,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(part(x)), part(y)).backward()
        opt.step()


def mine(t):
    return t[r * B:(r + 1) * B]


worst = 0.0
for stage in (1, 2):
    ref, model = net(), net()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2),
                                   named_parameters=model.named_parameters(), zero_stage=stage,
                                   bucket_elements=64)
    if len(opt.state):
        fail(f"stage {stage}: state before the first step")
    train(model, opt, STEPS, mine)
    train(ref, ref_opt, STEPS, lambda t: t)
    split = 0
    counts = []
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        rng = opt.owned_elements(p)
        counts.append(0 if rng is None else rng[1] - rng[0])
        if rng is None:
            if p in opt.state:
                fail(f"stage {stage}: state of {name}, which another rank owns")
            continue
        lo, hi = rng
        st, want = opt.state[p], ref_opt.state[q]
        if sorted(st) != sorted(want) or float(st["step"]) != float(want["step"]):
            fail(f"stage {stage} {name}: keys {sorted(st)} step {st.get('step')}, want {want}")
        whole = hi - lo == p.numel()
        split += not whole
        for k in ("exp_avg", "exp_avg_sq"):
            w = want[k] if whole else want[k].reshape(-1)[lo:hi]
            if st[k].shape != w.shape:
                fail(f"stage {stage} {name}.{k}: shape {tuple(st[k].shape)}, want {tuple(w.shape)}")
            err = float((st[k] - w).abs().max() / w.abs().max())
            worst = max(worst, err)
            if err > 1e-9:
                fail(f"stage {stage} {name}.{k}: relative error {err} against one process")
    every = hvd.allreduce(torch.tensor(counts), op=hvd.Sum, name=f"owned.{stage}")
    if every.tolist() != [p.numel() for p in model.parameters()]:
        fail(f"stage {stage}: owned elements over all ranks {every.tolist()}")
    if hvd.allreduce(torch.tensor(split), op=hvd.Sum, name=f"split.{stage}") == 0:
        fail(f"stage {stage}: no parameter split across ranks: the test needs one")
    p = next(p for p in model.parameters() if p in opt.state)
    view = opt.state[p]["exp_avg"]
    before = view.clone()
    train(model, opt, 1, mine)
    if torch.equal(view, before) or not torch.equal(view, opt.state[p]["exp_avg"]):
        fail(f"stage {stage}: state values are not live views of the optimizer's")
    sd = opt.state_dict()
    if sorted(sd) != ["param_groups", "shard_state", "zero"] or not any(sd["shard_state"]):
        fail(f"stage {stage}: state_dict changed form: {sorted(sd)}")
print(f"rank {r}: zero state max relative error {worst:.3g}", flush=True)
done()

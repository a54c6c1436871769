"""commlib.torch.elastic on every rank: an MLP trained with Adam through
DistributedOptimizer for STEPS steps, committing every COMMIT_EVERY steps,
inside @hvd.elastic.run. Planned self-kills (see _elastic_kills) make
``commlibrun --restarts`` start the job again; each attempt resumes from the
newest complete commit. At the end every rank saves its parameters and Adam
state to <out>/rank<R>.npz, and checks that they are bitwise equal across
ranks.

usage: elastic_torch.py OUT_DIR
"""
import os
import sys

import numpy as np
import torch
import torch.nn as nn

import commlib.torch as hvd
import _elastic_kills as kills
from _common import done, fail

torch.set_num_threads(1)
STEPS, COMMIT_EVERY, B = 24, 4, 8

hvd.init()
r = hvd.rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + r)
    x = torch.randn(B, 8, generator=g)
    return x, torch.sin(x[:, :4] * 3)


@hvd.elastic.run
def train(state):
    first = kills.FirstStep(state.step)
    while state.step < STEPS:
        kills.at_step(state.step)
        x, y = batch(state.step)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        state.step += 1
        first.done()
        if state.step % COMMIT_EVERY == 0:
            kills.set_step(state.step)
            state.commit()


train(state)
arrays = {f"param.{k}": v.detach().numpy() for k, v in model.state_dict().items()}
for i, s in opt.state_dict()["state"].items():
    arrays[f"adam.{i}.exp_avg"] = s["exp_avg"].numpy()
    arrays[f"adam.{i}.step"] = np.asarray(float(s["step"]))
flat = np.concatenate([a.ravel() for _, a in sorted(arrays.items())])
every = hvd.allgather(torch.from_numpy(flat)[None], name="final").numpy()
if not (every == flat).all():
    fail("final parameters differ between ranks")
commits = STEPS // COMMIT_EVERY if os.environ.get("COMMLIB_ELASTIC_DIR") else 0
if state.step != STEPS or state.commit_number != commits:
    fail(f"ended at step {state.step}, commit {state.commit_number}")
np.savez(f"{sys.argv[1]}/rank{r}.npz", **arrays)
done()

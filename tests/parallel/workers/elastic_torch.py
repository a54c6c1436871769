"""commlib.torch.elastic on every rank: an MLP trained with Adam through
DistributedOptimizer for STEPS steps, committing every COMMIT_EVERY steps,
inside @hvd.elastic.run. Planned self-kills (see _elastic_kills) make
``commlibrun --restarts`` start the job again; each attempt resumes from the
newest complete commit. The attempt that finishes then trains a second model
without interruption and prints the largest difference of parameters and
Adam state between the two.
"""
import os

import torch
import torch.nn as nn

import commlib.torch as hvd
import _elastic_kills as kills
from _common import done, fail

torch.set_num_threads(1)
STEPS, COMMIT_EVERY, B = 24, 4, 8

hvd.init()
r = hvd.rank()


def make():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    return model, opt


def train_step(model, opt, step):
    g = torch.Generator().manual_seed(1000 * step + r)
    x = torch.randn(B, 8, generator=g)
    opt.zero_grad()
    ((model(x) - torch.sin(x[:, :4] * 3)) ** 2).mean().backward()
    opt.step()


def flat(model, opt):
    adam = [s["exp_avg"].reshape(-1) for _, s in sorted(opt.state_dict()["state"].items())]
    return torch.cat([p.detach().reshape(-1) for p in model.state_dict().values()] + adam)


model, opt = make()
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)


@hvd.elastic.run
def train(state):
    kills.train_steps(state, STEPS, COMMIT_EVERY, lambda step: train_step(model, opt, step))


train(state)
commits = STEPS // COMMIT_EVERY if os.environ.get("COMMLIB_ELASTIC_DIR") else 0
if state.step != STEPS or state.commit_number != commits:
    fail(f"ended at step {state.step}, commit {state.commit_number}")
ref_model, ref_opt = make()
for step in range(STEPS):
    train_step(ref_model, ref_opt, step)
got, want = flat(model, opt), flat(ref_model, ref_opt)
every = hvd.allgather(got[None], name="final")
if not all(torch.equal(e, got) for e in every):
    fail("final parameters differ between ranks")
print(f"rank {r}: max difference from an uninterrupted run: {float((got - want).abs().max())!r}")
done()

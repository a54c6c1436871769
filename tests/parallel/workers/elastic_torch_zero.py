"""commlib.torch.elastic with a sharded (ZeRO) optimizer, one launch: every
rank commits its own shard of the Adam state at step COMMIT; a fresh model
and optimizer (other initial values) then load that commit through
@hvd.elastic.run, which must give back this rank's shard (not rank 0's) and
the committed parameters, and training on to STEPS must match an
uninterrupted run. argv[1:]: the stages to try in turn (1, 2: ZeRO
optimizer; 3: fully_shard model and a plain Adam), each with its own commit
directory under $COMMLIB_ELASTIC_DIR."""
import os
import sys

import torch
import torch.nn as nn

import commlib.torch as hvd
from _common import done, fail

torch.set_num_threads(1)
COMMIT, STEPS, B = 6, 12, 8
BASE_DIR = os.environ["COMMLIB_ELASTIC_DIR"]

hvd.init()
r = hvd.rank()


def make(seed, stage):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 5))  # 229 values: uneven shards at 3 ranks
    if stage == 3:
        hvd.fully_shard(model[0])
        hvd.fully_shard(model)
        return model, torch.optim.Adam(model.parameters(), lr=0.01)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters(), zero_stage=stage)
    return model, opt


def train_step(model, opt, step):
    g = torch.Generator().manual_seed(1000 * step + r)
    x = torch.randn(B, 8, generator=g)
    opt.zero_grad()
    ((model(x) - torch.sin(x[:, :5] * 3)) ** 2).mean().backward()
    opt.step()


def shard_state(opt):
    sd = opt.state_dict()
    states = sd["shard_state"] if "shard_state" in sd else [sd["state"][k] for k in sorted(sd["state"])]
    return torch.cat([v.reshape(-1).float() for st in states for v in st.values() if torch.is_tensor(v)])


def params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.state_dict().values()])


def scenario(stage):
    os.environ["COMMLIB_ELASTIC_DIR"] = os.path.join(BASE_DIR, f"stage{stage}")
    model, opt = make(0, stage)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
    for step in range(COMMIT):
        train_step(model, opt, step)
    state.step = COMMIT
    state.commit()
    committed_params, committed_shard = params(model).clone(), shard_state(opt).clone()

    model2, opt2 = make(1, stage)  # a restarted process: other initial values, no optimizer state
    state2 = hvd.elastic.TorchState(model=model2, optimizer=opt2, step=0)

    @hvd.elastic.run
    def resume(state):
        if state.step != COMMIT:
            fail(f"resumed at step {state.step}, expected {COMMIT}")
        if not torch.equal(params(model2), committed_params):
            fail(f"stage {stage}: parameters after loading the commit differ from the committed ones")
        if not torch.equal(shard_state(opt2), committed_shard):
            fail(f"stage {stage}: the optimizer shard after loading the commit is not this rank's committed shard")
        for step in range(state.step, STEPS):
            train_step(model2, opt2, step)

    resume(state2)
    ref_model, ref_opt = make(0, stage)
    for step in range(STEPS):
        train_step(ref_model, ref_opt, step)
    diff = max(float((params(model2) - params(ref_model)).abs().max()),
               float((shard_state(opt2) - shard_state(ref_opt)).abs().max()))
    if diff > 1e-6:
        fail(f"stage {stage}: resumed training differs from an uninterrupted run by {diff}")
    if stage < 3:  # (stage 3's parameters are this rank's shard, checked above)
        every = hvd.allgather(params(model2)[None], name=f"final.{stage}")
        if not all(torch.equal(e, params(model2)) for e in every):
            fail("final parameters differ between ranks")


for stage in map(int, sys.argv[1:]):
    scenario(stage)
done()

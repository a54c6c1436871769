"""commlib.torch.elastic.ElasticSampler on every rank (Horovod's).

1. (first attempt only, commits in a directory of their own) Each rank's
   share: equal lengths, together every index once (a few repeated when the
   dataset does not divide), in order without shuffle; TorchState(sampler=)
   sync merges the indices every rank recorded, after which the shares
   split what is left; restore() returns to the last commit's indices;
   set_epoch starts afresh; a commit holds the sampler's state, not its dataset.
2. EPOCHS epochs of a DataLoader over N items through the sampler, a
   collective per batch, the batch's indices recorded, a commit every
   COMMIT_EVERY batches and at each epoch's end, inside @hvd.elastic.run.
   The indices all ranks trained on in each step (allgathered) are kept in
   the state (``state.seen``), so they are committed with it. Planned self-kills (_elastic_kills) make
   ``commlibrun --restarts`` start the job again; the attempt that
   finishes checks that, over all ranks, each epoch trained on every index
   exactly once (work lost at a kill is redone, the rest not).
"""
import os

import torch

import commlib.torch as hvd
import _elastic_kills as kills
from _common import check_equal, done, fail

torch.set_num_threads(1)
N, B, EPOCHS, COMMIT_EVERY = 40, 4, 2, 2
hvd.init()
r, n = hvd.rank(), hvd.size()
attempt = int(os.environ.get("COMMLIB_RESTART", "0"))


def gathered(values):
    return [x for part in hvd.allgather_object(list(values)) for x in part]


# 1. The sampler's shares and its state
if attempt == 0:
    commits = os.environ["COMMLIB_ELASTIC_DIR"]
    os.environ["COMMLIB_ELASTIC_DIR"] = os.path.join(os.environ["ELASTIC_MARKERS"], "sampler_state")
    for size, shuffle in ((22, True), (23, True), (22, False)):
        s = hvd.elastic.ElasticSampler(list(range(size)), shuffle=shuffle, seed=3)
        mine = list(s)
        want_len = -(-size // n)
        if len(s) != want_len or len(mine) != want_len:
            fail(f"dataset of {size}: a share of {len(mine)} (len {len(s)}), want {want_len}")
        everyone = gathered(mine)
        if sorted(set(everyone)) != list(range(size)) or len(everyone) != want_len * n:
            fail(f"dataset of {size}: the shares {sorted(everyone)} do not cover it evenly")
        if not shuffle and mine != list(range(r, size, n)):
            fail(f"unshuffled share {mine}")
    dataset = [bytes([i]) * 1000 for i in range(N)]  # (40 kB: a commit that pickled it would show)
    sampler = hvd.elastic.ElasticSampler(dataset, seed=5)
    state = hvd.elastic.TorchState(sampler=sampler, epoch=0)
    if state.sampler is not sampler:
        fail("state.sampler is not the sampler given")
    list(sampler)
    for idx in range(r + 1):  # rank k records its first k + 1 batches
        sampler.record_batch(idx, B)
    recorded = gathered(sampler.processed_indices)
    state.sync()
    if sampler.processed_indices != set(recorded) or len(recorded) != B * n * (n + 1) // 2:
        fail(f"sync: processed {sorted(sampler.processed_indices)}, recorded {sorted(recorded)}")
    left, share = gathered(sampler), -(-(N - len(recorded)) // n)
    if set(left) != set(range(N)) - set(recorded) or len(sampler) != share or len(left) != share * n:
        fail(f"after sync the shares {sorted(left)} are not what is left")
    state.commit()
    sampler.record_batch(0, B)
    state.restore()
    check_equal(sorted(sampler.processed_indices), sorted(recorded), "restore: the committed indices")
    sampler.set_epoch(1)
    if sampler.processed_indices or len(sampler) != N // n or sampler.epoch != 1:
        fail("set_epoch: a fresh epoch")
    committed = os.path.join(os.environ["COMMLIB_ELASTIC_DIR"], f"rank{r}")
    nbytes = sum(os.path.getsize(os.path.join(committed, f)) for f in os.listdir(committed))
    if nbytes > 4096:
        fail(f"a commit of a sampler's state takes {nbytes} bytes: was the dataset pickled?")
    os.environ["COMMLIB_ELASTIC_DIR"] = commits

# 2. Epochs over a DataLoader, killed and resumed
sampler = hvd.elastic.ElasticSampler(list(range(N)), seed=7)
state = hvd.elastic.TorchState(sampler=sampler, epoch=0, step=0, seen=[])


@hvd.elastic.run
def train(state):
    first = kills.FirstStep(state.step)
    while state.epoch < EPOCHS:
        loader = torch.utils.data.DataLoader(list(range(N)), batch_size=B, sampler=state.sampler)
        for idx, batch in enumerate(loader):
            kills.at_step(state.step)
            trained = [i for part in hvd.allgather_object(batch.tolist()) for i in part]
            state.sampler.record_batch(idx, B)
            state.seen.append((state.epoch, trained))  # (every rank's: user state is rank 0's after a sync)
            state.step += 1
            first.done()
            if state.step % COMMIT_EVERY == 0:
                kills.set_step(state.step)
                state.commit()
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        kills.set_step(state.step)
        state.commit()


train(state)
for epoch in range(EPOCHS):
    trained = sorted(i for e, batch in state.seen if e == epoch for i in batch)
    if trained != list(range(N)):
        fail(f"epoch {epoch} trained on {trained}, not on every index once")
print(f"rank {r}: every epoch trained on each index once, in {state.step} steps")
done()

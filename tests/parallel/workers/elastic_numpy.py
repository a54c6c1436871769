"""commlib.elastic.ObjectState (framework-free) on every rank: STEPS steps
that each add an allreduced array to ``state.total``, committing every
COMMIT_EVERY steps inside @elastic.run. Planned self-kills (_elastic_kills)
or ``ELASTIC_FAIL_RANK=R`` (rank R dies with exit code 3 at step 3 of
every attempt) exercise ``commlibrun --restarts``. The final total is checked
against its closed form.

usage: elastic_numpy.py [MARKER]   (MARKER: ignored, names the processes)
"""
import os
import sys

import numpy as np

import commlib
import _elastic_kills as kills
from _common import check_equal, done, fail
from commlib import elastic

STEPS, COMMIT_EVERY = 12, 2
commlib.init()
r, n = commlib.rank(), commlib.size()
state = elastic.ObjectState(step=0, total=np.zeros(3))
fail_rank = os.environ.get("ELASTIC_FAIL_RANK")


def step_fn(step):
    if fail_rank is not None and int(fail_rank) == r and step == 3:
        print(f"rank {r}: failing on purpose at step 3", file=sys.stderr, flush=True)
        os._exit(3)  # as a crash would: no shutdown() (see the note in test_elastic)
    state.total = state.total + commlib.allreduce(np.full(3, (r + 1) * step, float),
                                                  op=commlib.Sum, name="step")


@elastic.run
def train(state):
    kills.train_steps(state, STEPS, COMMIT_EVERY, step_fn)


train(state)
want = np.full(3, n * (n + 1) / 2 * sum(range(STEPS)))
check_equal(state.total, want, "final total")
expected_commits = STEPS // COMMIT_EVERY if os.environ.get(elastic.ELASTIC_DIR_ENV) else 0
if state.commit_number != expected_commits:
    fail(f"commit number {state.commit_number} != {expected_commits}")
done()

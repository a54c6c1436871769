"""Restart from the last commit (commlib.elastic, ``commlibrun --restarts``).

A 2-rank torch job and a 2-rank Keras job are SIGKILLed three times in one
run (a random rank at a random step; at least one kill lands inside a
commit: a torn temporary file, or between a rank's rename and the barrier
that completes the commit) and must end with the parameters and optimizer
state of an uninterrupted run (trained after the elastic one, in the same
processes) within 1e-6, having lost at most the steps since the last commit
at each kill. commlibrun must name each restart and its cause. The time from
each kill to the first step after the restart is measured (target: 15 s).
A TensorFlow loop of one's own (commlib.tensorflow.elastic) killed once
resumes and matches too; torch's ElasticSampler resumes an epoch with the
indices no rank had committed. A job that fails more often than --restarts allows
ends non-zero naming the failing rank, with no process left behind. The
framework-free ObjectState runs the same protocol at 3 ranks; a commit
directory written by a job of another size is refused on every rank.
"""
import importlib.util
import os
import random
import re
import uuid

import pytest
from test_launcher_run import assert_no_leftovers

KILL_KINDS = ("step", "commit", "aftercommit")


def needs(module):
    # find_spec, not importorskip: importing TensorFlow here would cost seconds.
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed")


def plan_kills(rng, n_ranks, steps, commit_steps, count=3):
    """``count`` kills (rank, step, kind), at least one inside a commit, each at
    a distinct point, so that each ends one attempt; returned in the order
    they happen."""
    kills, points = [], set()
    while len(kills) < count:
        kind = rng.choice(KILL_KINDS[1:] if not kills else KILL_KINDS)
        if kind == "step":
            step = rng.randint(1, steps - 1)
            point = 2 * step  # before step `step`, after the commit that may end step - 1
        else:
            step = rng.randint(1, steps)
            point = 2 * min(c for c in commit_steps if c >= step) - 1
        if point not in points:
            points.add(point)
            kills.append((point, rng.randrange(n_ranks), step, kind))
    return [k[1:] for k in sorted(kills)]


def run_with_kills(ranks, tmp_path, worker, steps, commit_steps, timeout, n=2):
    # ELASTIC_TEST_SEED=<seed> replays the kills of a failed run (its message names the seed).
    seed = int(os.environ.get("ELASTIC_TEST_SEED", random.randrange(1 << 30)))
    kills = plan_kills(random.Random(seed), n, steps, commit_steps)
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {"ELASTIC_KILLS": ",".join(f"{r}:{s}:{k}" for r, s, k in kills),
           "ELASTIC_MARKERS": str(markers), "COMMLIB_ELASTIC_DIR": str(tmp_path / "commits")}
    run = ranks(n, worker, timeout=timeout, env=env, launcher_args=("--restarts", "3"))
    return run, kills, markers, f"seed {seed}, kills {env['ELASTIC_KILLS']}"


def check_restarts(run, kills, markers, what, steps, max_lost):
    """Each kill ended one attempt and was named; each attempt resumed at
    most ``max_lost`` steps before its kill. Returns the seconds from each
    kill to the relaunched processes' start and to their first step."""
    assert run.returncode == 0, f"{what}\n{run}"
    for k, (rank, _, _) in enumerate(kills, 1):
        assert (f"commlibrun: restart {k} of 3 after rank {rank} was killed by signal SIGKILL"
                in run.stderr), f"{what}\n{run}"
    assert "restart 4" not in run.stderr and "giving up" not in run.stderr, run
    killed = sorted(tuple(map(float, p.read_text().split())) for p in markers.iterdir())
    assert len(killed) == 3, f"{what}: {killed}"
    latencies = []
    for k, (kill_time, kill_step) in enumerate(killed, 1):
        resumed = int(re.search(rf"attempt {k} resumed at step (\d+)", run.stdout).group(1))
        assert 0 <= kill_step - resumed <= max_lost, f"{what}: attempt {k} resumed at {resumed}"
        started = float(re.search(rf"attempt {k} started at (\S+)", run.stdout).group(1))
        first = re.search(rf"attempt {k} first step done at (\S+)", run.stdout)
        if first is None:
            # Nothing was left to do (killed after the last commit was complete), or
            # the next kill came during this attempt's first step (it resumed there).
            next_kill_step = killed[k][1] if k < len(killed) else None
            assert resumed == steps or next_kill_step == resumed, \
                f"{what}: attempt {k} did no step\n{run}"
            continue
        first = float(first.group(1))
        latencies.append((round(started - kill_time, 1), round(first - kill_time, 1)))
    diffs = [float(d) for d in re.findall(r"max difference from an uninterrupted run: (\S+)",
                                          run.stdout)]
    assert len(diffs) == 2 and max(diffs) <= 1e-6, f"{what}\n{run}"
    print(f"{what}: (relaunch, first step) seconds after each kill: {latencies}")
    return latencies


@needs("torch")
@pytest.mark.timeout(200)
def test_torch_job_killed_three_times_matches_uninterrupted_run(ranks, tmp_path):
    run, kills, markers, what = run_with_kills(ranks, tmp_path, "elastic_torch.py", 24,
                                               range(4, 25, 4), timeout=160)
    run.assert_ok(2)
    latencies = check_restarts(run, kills, markers, what, 24, max_lost=4)
    # The target is 15 s; the bound leaves room for a loaded CI machine.
    assert max((first for _, first in latencies), default=0) < 45, latencies


@needs("tensorflow")
@pytest.mark.timeout(260)
def test_keras_job_killed_three_times_matches_uninterrupted_run(ranks, tmp_path):
    # Commits after batches 3 and 6 of each 8-batch epoch, and at its end.
    commit_steps = [e * 8 + b for e in range(3) for b in (3, 6, 8)]
    run, kills, markers, what = run_with_kills(ranks, tmp_path, "elastic_keras.py", 24,
                                               commit_steps, timeout=220)
    run.assert_ok(2)
    latencies = check_restarts(run, kills, markers, what, 24, max_lost=3)
    assert max((first for _, first in latencies), default=0) < 60, latencies


def run_killed_once(ranks, tmp_path, worker, step, resumed, timeout):
    """``worker`` on 2 ranks with ``--restarts 1``, rank 1 killing itself
    before step ``step``: the job succeeds, naming the restart, and its
    second attempt resumes at step ``resumed``."""
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {"ELASTIC_KILLS": f"1:{step}:step", "ELASTIC_MARKERS": str(markers),
           "COMMLIB_ELASTIC_DIR": str(tmp_path / "commits")}
    run = ranks(2, worker, timeout=timeout, env=env, launcher_args=("--restarts", "1"))
    run.assert_ok(2)
    assert "commlibrun: restart 1 of 1 after rank 1 was killed by signal SIGKILL" in run.stderr, run
    assert f"attempt 1 resumed at step {resumed}" in run.stdout, run
    return run


@needs("tensorflow")
@pytest.mark.timeout(200)
def test_tensorflow_custom_loop_killed_once_matches_uninterrupted_run(ranks, tmp_path):
    # commlib.tensorflow.elastic: commits after steps 3, 6, 9, 12.
    run = run_killed_once(ranks, tmp_path, "elastic_tf_loop.py", 5, 3, timeout=160)
    diffs = [float(d) for d in re.findall(r"max difference from an uninterrupted run: (\S+)",
                                          run.stdout)]
    assert len(diffs) == 2 and max(diffs) <= 1e-6, run


@needs("torch")
@pytest.mark.timeout(120)
def test_elastic_sampler_resumes_the_epoch_with_what_is_left(ranks, tmp_path):
    # 40 indices, batches of 4, 2 ranks: 5 batches per epoch; commits after
    # every 2nd step and at each epoch's end. Rank 1 dies before step 7 (the
    # 2nd batch of epoch 1): the restart resumes at step 6 and splits the 32
    # indices left of epoch 1 anew.
    run = run_killed_once(ranks, tmp_path, "elastic_sampler.py", 7, 6, timeout=100)
    assert "every epoch trained on each index once, in 10 steps" in run.stdout, run


@pytest.mark.timeout(120)
def test_object_state_three_ranks(ranks, tmp_path):
    run, kills, markers, what = run_with_kills(ranks, tmp_path, "elastic_numpy.py", 12,
                                               range(2, 13, 2), timeout=100, n=3)
    run.assert_ok(3)
    for k, (rank, _, _) in enumerate(kills, 1):
        assert f"restart {k} of 3 after rank {rank} was killed by signal SIGKILL" in run.stderr, \
            f"{what}\n{run}"


@pytest.mark.timeout(120)
def test_job_failing_more_than_restarts_allow_ends_naming_rank(ranks, tmp_path):
    # The failing rank leaves with os._exit(3). With sys.exit(3) its atexit
    # shutdown() makes the other rank fail at once, and that rank's status can
    # be stamped first, so commlibrun would name it as the first failure.
    marker = uuid.uuid4().hex
    run = ranks(2, "elastic_numpy.py", marker, timeout=100,
                env={"ELASTIC_FAIL_RANK": "1", "COMMLIB_ELASTIC_DIR": str(tmp_path)},
                launcher_args=("--restarts", "2"))
    assert run.returncode == 3, run
    for k in (1, 2):
        assert f"commlibrun: restart {k} of 2 after rank 1 exited with code 3" in run.stderr, run
    assert run.stderr.count("commlibrun: job failed: rank 1 exited with code 3") == 3, run
    assert "commlibrun: giving up: the job failed 3 times (2 restarts allowed)" in run.stderr, run
    assert run.stdout.count("attempt 2 resumed at step 2") == 1, run
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
def test_commits_of_another_job_size_are_refused(ranks, tmp_path):
    env = {"COMMLIB_ELASTIC_DIR": str(tmp_path)}
    ranks(2, "elastic_numpy.py", timeout=60, env=env).assert_ok(2)
    run = ranks(3, "elastic_numpy.py", timeout=60, env=env)
    assert run.returncode != 0, run
    for r in range(3):
        assert re.search(rf"\[{r}\]: .*ElasticStateError: COMMLIB_ELASTIC_DIR=\S+ holds commits "
                         r"of a job of \[2\] ranks, this job has 3", run.stdout + run.stderr), run


@needs("torch")
@pytest.mark.timeout(120)
def test_sharded_state_commits_and_resumes_per_rank(ranks, tmp_path):
    # ZeRO stages 1 and 2 and a fully_shard model at 3 ranks (uneven shards):
    # each rank commits and gets back its own shard, not rank 0's.
    run = ranks(3, "elastic_torch_zero.py", "1", "2", "3", timeout=100,
                env={"COMMLIB_ELASTIC_DIR": str(tmp_path)})
    run.assert_ok(3)

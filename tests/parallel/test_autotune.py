"""Autotune (COMMLIB_AUTOTUNE=1, workers/autotune_numpy.py, autotune_torch.py)
with a small search budget (one scored window of one step per setting): the
search gets through, every rank applies the same settings after the same
collectives, results stay right every step, and rank 0's CSV log lists every
setting tried with the chosen (best-scored, final) one marked. Also
commlib_set_fusion_threshold on one rank only (workers/autotune_set_threshold.py):
applied on every rank at the same point."""
import pytest

BUDGET = {"COMMLIB_AUTOTUNE": "1", "COMMLIB_AUTOTUNE_WINDOW_STEPS": "1", "COMMLIB_AUTOTUNE_WINDOWS": "1",
          "COMMLIB_FUSION_THRESHOLD": "0"}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n,env,tree", [(2, {}, "shm"), (3, {}, "shm"), (3, {"COMMLIB_SHM": "0"}, "tree")],
                         ids=["2", "3", "3-no-shm"])
def test_autotune_numpy(ranks, tmp_path, n, env, tree):
    log = tmp_path / "tune.csv"
    run = ranks(n, "autotune_numpy.py", str(log), tree, timeout=150,
                env={**BUDGET, "COMMLIB_AUTOTUNE_LOG": str(log), **env})
    run.assert_ok(n)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [3])  # (2 ranks: the numpy case above; the frontend adds no rank-count logic)
def test_autotune_torch(ranks, tmp_path, n):
    log = tmp_path / "tune.csv"
    budget = {k: v for k, v in BUDGET.items() if k != "COMMLIB_AUTOTUNE"}  # (commlibrun's flags set them)
    run = ranks(n, "autotune_torch.py", str(log), timeout=150, env=budget,
                launcher_args=("--autotune", "--autotune-log-file", str(log)))
    run.assert_ok(n)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_set_fusion_threshold_on_one_rank_applies_everywhere(ranks, n):
    run = ranks(n, "autotune_set_threshold.py", timeout=150)
    run.assert_ok(n)

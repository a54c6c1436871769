"""Sharded ZeRO checkpoints across world sizes (workers/torch_zero_checkpoint.py):
saved at 3 ranks and loaded at 2, and the reverse (stages and bucket sizes
differ between saving and loading too; stage 3 is fully_shard, also loaded
from a stage-2 checkpoint); training continues to the
parameters of an uninterrupted run within 1e-6; full_state_dict (stage 3
too) continues in a plain optimizer; missing files and parameters raise."""
import re

import pytest

pytest.importorskip("torch")


# Each job saves (or loads) two checkpoints, one after the other: two saving
# jobs, at 3 ranks (stages 2 and 3) and at 2 (stages 1 and 2), and two loading
# ones, at the other size.
SAVED = {3: (2, 3), 2: (1, 2)}  # ranks: the stages saved at that size


@pytest.fixture(scope="module")
def checkpoints(ranks, tmp_path_factory):
    """{(ranks, stage): the directory of the checkpoint saved there}."""
    out = {}
    for save_n, stages in SAVED.items():
        dirs = {k: tmp_path_factory.mktemp(f"ckpt-{save_n}-{k}") / "ckpt" for k in stages}
        ranks(save_n, "torch_zero_checkpoint.py", "save", *(f"{d}:{k}" for k, d in dirs.items()),
              timeout=100).assert_ok(save_n)
        for k, d in dirs.items():
            files = sorted(p.name for p in d.iterdir())
            assert files == ["meta.pt"] + [f"shard-{i:05d}.pt" for i in range(save_n)], files
            out[save_n, k] = d
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("save_n,load_n,pairs", [(3, 2, [(2, 1), (3, 3)]), (2, 3, [(1, 2), (2, 3)])],
                         ids=["3-to-2", "2-to-3"])
def test_checkpoint_across_world_sizes(ranks, checkpoints, save_n, load_n, pairs):
    """``pairs``: (stage saved at ``save_n`` ranks, stage loaded at ``load_n``)."""
    args = [f"{checkpoints[save_n, saved]}:{loaded}" for saved, loaded in pairs]
    run = ranks(load_n, "torch_zero_checkpoint.py", "load", *args, timeout=100)
    run.assert_ok(load_n)
    errs = [float(e) for e in re.findall(r"resumed relative error (\S+)", run.stdout)]
    assert len(errs) == load_n * len(pairs) and max(errs) <= 1e-6, run

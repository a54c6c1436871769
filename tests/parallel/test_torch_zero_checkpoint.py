"""Sharded ZeRO checkpoints across world sizes (workers/torch_zero_checkpoint.py):
saved at 3 ranks and loaded at 2, and the reverse (stages and bucket sizes
differ between saving and loading too; stage 3 is fully_shard, also loaded
from a stage-2 checkpoint); training continues to the
parameters of an uninterrupted run within 1e-6; full_state_dict (stage 3
too) continues in a plain optimizer; missing files and parameters raise."""
import re

import pytest

pytest.importorskip("torch")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("save_n,save_stage,load_n,load_stage",
                         [(3, 2, 2, 1), (2, 1, 3, 2), (3, 3, 2, 3), (2, 2, 3, 3)])
def test_checkpoint_across_world_sizes(ranks, tmp_path, save_n, save_stage, load_n, load_stage):
    ckpt = str(tmp_path / "ckpt")
    ranks(save_n, "torch_zero_checkpoint.py", "save", ckpt, str(save_stage),
          timeout=80).assert_ok(save_n)
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == ["meta.pt"] + [f"shard-{i:05d}.pt" for i in range(save_n)], files
    run = ranks(load_n, "torch_zero_checkpoint.py", "load", ckpt, str(load_stage), timeout=80)
    run.assert_ok(load_n)
    errs = [float(e) for e in re.findall(r"resumed relative error (\S+)", run.stdout)]
    assert len(errs) == load_n and max(errs) <= 1e-6, run

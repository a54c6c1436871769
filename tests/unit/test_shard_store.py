"""commlib.shard_store: arrays written per rank under one world size read
back as another size's shards (every element where the layouts say, padding
zero), and errors for missing files and keys; commlib.sharding.check_zero_stage."""
import numpy as np
import pytest

from commlib.shard_store import (SavedArrays, read_meta, read_range, read_shard, shard_folder,
                                 write_arrays, write_meta)
from commlib.sharding import DEFAULT_BUCKET_ELEMENTS, Bucket, check_zero_stage, plan_buckets

ENTRIES = [("a", (3, 4), "float32", 0), ("b", (5,), "float32", 0), ("c", (7,), "float32", 0),
           ("e", (30,), "float32", 0)]


def full_values():
    """name -> distinct values, so that any misplaced element shows."""
    out, start = {}, 0
    for name, shape, _, _ in ENTRIES:
        n = int(np.prod(shape))
        out[name] = np.arange(start, start + n, dtype=np.float32) + 0.5
        start += n
    return out


def save(directory, world, bucket):
    layout = plan_buckets(ENTRIES, world, bucket)
    values = full_values()
    for pos in range(world):
        arrays = {}
        for bi, b in enumerate(layout):
            shard = np.zeros(b.shard, np.float32)
            for slot, lo, hi, at in b.owned_slots(pos):
                shard[at:at + hi - lo] = values[slot.name][lo:hi]
            arrays[f"b{bi}.param"] = shard
            arrays[f"b{bi}.m"] = -shard
        write_arrays(shard_folder(directory, pos), arrays)
    write_meta(directory, {"world": world, "layout": [b.to_dict() for b in layout]})


@pytest.mark.parametrize("old_world,new_world", [(3, 2), (2, 3), (1, 4), (4, 1)])
def test_reshard_through_files(tmp_path, old_world, new_world):
    save(tmp_path, old_world, 20)
    meta = read_meta(tmp_path)
    old = [Bucket.from_dict(d) for d in meta["layout"]]
    saved = SavedArrays(tmp_path, meta["world"])
    values = full_values()
    for name, shape, _, _ in ENTRIES:
        out = np.empty(int(np.prod(shape)), np.float32)
        read_range(old, saved, name, 0, out.size, "param", out)
        assert np.array_equal(out, values[name]), name
    for b in plan_buckets(ENTRIES, new_world, 25):
        for pos in range(new_world):
            got = read_shard(b, pos, old, saved, "m", np.float32)
            want = np.zeros(b.shard, np.float32)
            for slot, lo, hi, at in b.owned_slots(pos):
                want[at:at + hi - lo] = -values[slot.name][lo:hi]
            assert np.array_equal(got, want)


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="save_sharded"):
        read_meta(tmp_path / "none")
    save(tmp_path, 2, 20)
    saved = SavedArrays(tmp_path, 2)
    with pytest.raises(KeyError, match="b0.v"):
        saved.array(0, "b0.v")
    with pytest.raises(FileNotFoundError, match="saved by 2 ranks"):
        saved.array(2, "b0.param")
    assert check_zero_stage(2, None) == DEFAULT_BUCKET_ELEMENTS
    for stage, bucket in ((0, 5), (3, 5), (True, 5), (1.0, 5), ("1", 5), (1, 0), (1, 2.0), (1, False)):
        with pytest.raises(ValueError):
            check_zero_stage(stage, bucket)

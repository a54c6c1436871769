"""The files of a sharded checkpoint in numpy form, and reading a range of
a parameter back from shards saved at another world size (the layout is
commlib.sharding's). Used by the Keras save_sharded/load_sharded; nothing
here imports a framework.

    directory/
      meta.json          the layout, world size and the frontend's metadata
      shard-00000/       one folder of arrays per rank of the saving set
        index.json       the arrays' keys, in file order ("b0.param", "b0.momentum", ...)
        0.npy, 1.npy ... memory-mapped when read

Every file is written under a temporary name and renamed, so a reader
never sees half a file.
"""
from __future__ import annotations

import json
import os

import numpy as np

from .sharding import locate

META = "meta.json"


def shard_folder(directory, pos) -> str:
    """The folder of rank position ``pos`` (or of a named part, e.g. "extra")."""
    name = f"shard-{pos:05d}" if isinstance(pos, int) else str(pos)
    return os.path.join(directory, name)


def _write_json(path, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def write_arrays(folder, arrays: dict) -> None:
    """Writes ``arrays`` (key -> numpy array) into ``folder``."""
    os.makedirs(folder, exist_ok=True)
    keys = list(arrays)
    for j, k in enumerate(keys):
        path = os.path.join(folder, f"{j}.npy")
        with open(path + ".tmp", "wb") as f:
            np.save(f, np.ascontiguousarray(arrays[k]), allow_pickle=False)
        os.replace(path + ".tmp", path)
    _write_json(os.path.join(folder, "index.json"), keys)


def write_meta(directory, meta: dict) -> None:
    os.makedirs(directory, exist_ok=True)
    _write_json(os.path.join(directory, META), meta)


def read_meta(directory) -> dict:
    path = os.path.join(directory, META)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: not a directory written by save_sharded")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class SavedArrays:
    """The arrays of the saved folders, opened (memory-mapped) on first use."""

    def __init__(self, directory, world: int):
        self.directory, self.world, self._index = directory, world, {}

    def keys(self, pos) -> list:
        if pos not in self._index:
            path = os.path.join(shard_folder(self.directory, pos), "index.json")
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path} is missing: the checkpoint was saved by "
                                        f"{self.world} ranks")
            with open(path, encoding="utf-8") as f:
                self._index[pos] = {k: j for j, k in enumerate(json.load(f))}
        return list(self._index[pos])

    def array(self, pos, key: str) -> np.ndarray:
        self.keys(pos)
        j = self._index[pos].get(key)
        if j is None:
            raise KeyError(f"the checkpoint has no {key!r} in {shard_folder(self.directory, pos)}")
        return np.load(os.path.join(shard_folder(self.directory, pos), f"{j}.npy"),
                       mmap_mode="r", allow_pickle=False)


def read_range(old_layout, saved: SavedArrays, name: str, lo: int, hi: int, key: str,
               out: np.ndarray) -> None:
    """Elements lo..hi of parameter ``name``'s array ``key`` (e.g. "param",
    "momentum"), saved in bucket-local arrays ``b<i>.<key>`` under
    ``old_layout``, copied into ``out`` (hi - lo elements)."""
    for pos, bi, at, count, dst in locate(old_layout, name, lo, hi):
        out[dst:dst + count] = saved.array(pos, f"b{bi}.{key}")[at:at + count]


def read_shard(bucket, pos: int, old_layout, saved: SavedArrays, key: str, dtype) -> np.ndarray:
    """Rank ``pos``'s shard of ``bucket`` (a commlib.sharding.Bucket of the
    loading layout) of array ``key``, read from shards saved under
    ``old_layout``; padding is zero."""
    out = np.zeros(bucket.shard, dtype=dtype)
    for slot, lo, hi, at in bucket.owned_slots(pos):
        read_range(old_layout, saved, slot.name, lo, hi, key, out[at:at + hi - lo])
    return out

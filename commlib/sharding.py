"""The plan behind ZeRO sharding, framework-free: which parameter goes into
which flat bucket at which offset, which elements of a bucket each rank owns,
and where a range of a parameter lies in a layout saved at another world
size (for resharding checkpoints).

A bucket holds parameters of one dtype and one optimizer param group, laid
end to end in a fixed order; it is padded to ``world * shard`` elements so
that every rank owns the same number of elements (rank ``i`` of the set owns
``[i * shard, (i + 1) * shard)``). The padding is never part of a parameter.

    layout = plan_buckets([("fc.weight", (4, 3), "float32", 0), ...], world=3)
    for slot, lo, hi, at in layout[0].owned_slots(pos):
        ...  # elements lo..hi of slot.name are this rank's, at offset `at` of its shard

Nothing here imports a framework; shapes are tuples, dtypes are names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from numbers import Integral

# Default largest bucket, in elements (a larger parameter gets a bucket of its own).
DEFAULT_BUCKET_ELEMENTS = 1 << 23


@dataclass(frozen=True)
class Slot:
    """One parameter inside a bucket."""

    name: str
    shape: tuple
    offset: int  # first element in the bucket

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass
class Bucket:
    """Parameters of one dtype and param group, flat, padded to world * shard."""

    dtype: str
    group: int
    world: int
    slots: list = field(default_factory=list)

    @property
    def numel(self) -> int:
        return self.slots[-1].offset + self.slots[-1].numel if self.slots else 0

    @property
    def shard(self) -> int:
        """Elements each rank owns (ceil(numel / world), at least 1)."""
        return max(1, -(-self.numel // self.world))

    @property
    def padded(self) -> int:
        return self.shard * self.world

    def owned(self, pos: int) -> tuple[int, int]:
        """The range of bucket elements rank ``pos`` (of the set) owns, padding included."""
        return pos * self.shard, (pos + 1) * self.shard

    def owned_slots(self, pos: int):
        """(slot, lo, hi, at) for every parameter with elements in rank
        ``pos``'s shard: its elements lo..hi lie at offset ``at`` of the shard."""
        for i, lo, hi, at in self.slots_in(*self.owned(pos)):
            yield self.slots[i], lo, hi, at

    def slots_in(self, a: int, b: int):
        """(slot index, lo, hi, at) for every parameter with elements in the
        bucket's elements a..b: its elements lo..hi lie at offset ``at`` from a."""
        for i, s in enumerate(self.slots):
            lo, hi = max(a, s.offset), min(b, s.offset + s.numel)
            if lo < hi:
                yield i, lo - s.offset, hi - s.offset, lo - a

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "group": self.group, "world": self.world,
                "slots": [[s.name, list(s.shape), s.offset] for s in self.slots]}

    @classmethod
    def from_dict(cls, d: dict) -> "Bucket":
        return cls(d["dtype"], int(d["group"]), int(d["world"]),
                   [Slot(n, tuple(shape), int(off)) for n, shape, off in d["slots"]])


def check_zero_stage(stage, bucket_elements) -> int:
    """ValueError unless ``stage`` is 1 or 2 and ``bucket_elements`` a
    positive int (None: the default); returns the bucket size."""
    if isinstance(stage, bool) or not isinstance(stage, Integral) or stage not in (1, 2):
        if stage == 0 and not isinstance(stage, bool) and isinstance(stage, Integral):
            raise ValueError(f"bucket_elements ({bucket_elements!r}) is ZeRO's bucket size: it "
                             "takes zero_stage=1 or 2, not 0")
        raise ValueError(f"zero_stage must be 0, 1 or 2, got {stage!r}")
    if bucket_elements is None:
        bucket_elements = DEFAULT_BUCKET_ELEMENTS
    if isinstance(bucket_elements, bool) or not isinstance(bucket_elements, int) \
            or bucket_elements < 1:
        raise ValueError(f"bucket_elements must be a positive int, got {bucket_elements!r}")
    return bucket_elements


def plan_buckets(entries, world: int, max_elements: int = DEFAULT_BUCKET_ELEMENTS) -> list:
    """Buckets for ``entries`` = [(name, shape, dtype name, group index)], in
    that order: consecutive parameters of one (dtype, group) share a bucket
    until it would exceed ``max_elements``."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if max_elements < 1:
        raise ValueError(f"max_elements must be >= 1, got {max_elements}")
    open_buckets, out = {}, []
    for name, shape, dtype, group in entries:
        shape = tuple(int(d) for d in shape)
        key = (dtype, int(group))
        b = open_buckets.get(key)
        if b is None or (b.slots and b.numel + prod(shape) > max_elements):
            b = open_buckets[key] = Bucket(dtype, int(group), world)
            out.append(b)
        b.slots.append(Slot(name, shape, b.numel))
    return out


def index_by_name(layout) -> dict:
    """name -> (bucket index, slot)."""
    return {s.name: (i, s) for i, b in enumerate(layout) for s in b.slots}


def locate(layout, name: str, lo: int, hi: int) -> list:
    """Where elements lo..hi of parameter ``name`` lie in ``layout`` (a list
    of Buckets, e.g. one saved at another world size): a list of
    (rank position, bucket index, start in that rank's shard, count, start in lo..hi)."""
    where = index_by_name(layout).get(name)
    if where is None:
        raise KeyError(f"parameter {name!r} is not in the saved layout")
    bi, slot = where
    if not 0 <= lo <= hi <= slot.numel:
        raise ValueError(f"range {lo}..{hi} is outside parameter {name!r} ({slot.numel} elements)")
    bucket = layout[bi]
    out, pos = [], lo
    while pos < hi:
        flat = slot.offset + pos
        rank, at = divmod(flat, bucket.shard)
        count = min(hi - pos, bucket.shard - at)
        out.append((rank, bi, at, count, pos - lo))
        pos += count
    return out

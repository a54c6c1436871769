"""commlib.sharding: bucket plans, owned ranges and locating parameter ranges
in a layout saved at another world size, checked against a brute-force
element map."""
import pytest

from commlib.sharding import Bucket, locate, plan_buckets

ENTRIES = [("a", (3, 4), "float32", 0), ("b", (5,), "float32", 0), ("c", (7,), "float64", 0),
           ("d", (2, 2), "float32", 1), ("e", (30,), "float32", 0), ("f", (1,), "float32", 0)]


def element_map(layout):
    """(name, element) -> (rank, bucket, offset in that rank's shard), by brute force."""
    out = {}
    for bi, b in enumerate(layout):
        for s in b.slots:
            for k in range(s.numel):
                flat = s.offset + k
                out[(s.name, k)] = (flat // b.shard, bi, flat % b.shard)
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_plan_covers_every_element_once(world):
    layout = plan_buckets(ENTRIES, world, max_elements=20)
    assert sorted(s.name for b in layout for s in b.slots) == sorted(e[0] for e in ENTRIES)
    for b in layout:
        assert b.padded == b.shard * world >= b.numel
        assert len({b.dtype}) == 1 and all(e[2] == b.dtype and e[3] == b.group
                                          for e in ENTRIES for s in b.slots if e[0] == s.name)
        owned = []
        for pos in range(world):
            for slot, lo, hi, at in b.owned_slots(pos):
                owned += [(slot.name, k, pos, at + k - lo) for k in range(lo, hi)]
        assert len(owned) == b.numel  # each element owned exactly once
        assert all(element_map([b])[(name, k)][::2] == (pos, at) for name, k, pos, at in owned)
    # the 30-element parameter exceeds the cap alone: a bucket of its own
    assert [s.name for b in layout for s in b.slots if len(b.slots) == 1 and s.name == "e"]


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_locate_matches_element_map(world):
    layout = plan_buckets(ENTRIES, world, max_elements=16)
    truth = element_map(layout)
    for name, shape, _, _ in ENTRIES:
        numel = 1
        for d in shape:
            numel *= d
        for lo, hi in [(0, numel), (1, numel), (0, max(1, numel // 2)), (numel, numel)]:
            got = {}
            for rank, bi, at, count, dst in locate(layout, name, lo, hi):
                for k in range(count):
                    got[lo + dst + k] = (rank, bi, at + k)
            assert got == {k: truth[(name, k)] for k in range(lo, hi)}


def test_round_trip_and_errors():
    layout = plan_buckets(ENTRIES, 3)
    assert [Bucket.from_dict(b.to_dict()) for b in layout] == layout
    with pytest.raises(KeyError, match="zz"):
        locate(layout, "zz", 0, 1)
    with pytest.raises(ValueError, match="outside"):
        locate(layout, "a", 0, 13)
    with pytest.raises(ValueError):
        plan_buckets(ENTRIES, 0)
    with pytest.raises(ValueError):
        plan_buckets(ENTRIES, 2, max_elements=0)

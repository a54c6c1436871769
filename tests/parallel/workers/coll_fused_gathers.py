"""Run by tests/parallel/test_fused_gathers.py: many allgathers and
reducescatters in flight at once, fused by the core into one collective each
(csrc/exec/fused_gathers.cc), checked on every rank against numpy.

- allgathers of mixed dtypes and trailing shapes, each rank with its own
  number of rows (none on some ranks), some into a caller's `out`;
- one of them with an `out` of the wrong size on the last rank: that request
  alone fails there, after taking part; its batch-mates and the other ranks
  are unaffected;
- reducescatters of mixed ops, dtypes (half types), explicit splits, scale
  factors and inputs in pieces (ZeRO's), some into a caller's `out`;
- a batch on a process set of all ranks but the last (at 3 ranks or more);
- allgathers fused whose input lies in their out (in place, or at another
  rank's place there);
- three rounds each, so that later rounds run from the response cache;
- the timeline (argv[1]) must show fused allgathers and reducescatters.

Inputs are small integers, so every sum is exact and results must be equal.
"""
import sys

import numpy as np

import commlib
from _common import check_equal, done, expect_raises, fail
from commlib.timeline import load_events, rank_file

path = sys.argv[1]
commlib.init()
r, n = commlib.rank(), commlib.size()
commlib.start_timeline(path)
ROUNDS = 3
GATHER_DTYPES = [np.float32, np.int64, np.uint8, np.float16, np.float64, np.int32]
RS_CASES = [  # (dtype, op, prescale, postscale, splits?, pieces? (never both: pieces take no splits))
    (np.float32, commlib.Sum, 1.0, 1.0, False, False),
    (np.float32, commlib.Sum, 1.0, 1.0, True, False),
    (np.float32, commlib.Sum, 1.0, 1.0, False, True),
    (np.float32, commlib.Average, 1.0, 1.0, False, False),
    (np.float32, commlib.Average, 1.0, 1.0, True, False),
    (np.int32, commlib.Max, 1.0, 1.0, False, False),
    (np.int32, commlib.Max, 1.0, 1.0, True, False),
    (np.float16, commlib.Sum, 1.0, 1.0, False, False),
    (np.float16, commlib.Sum, 1.0, 1.0, False, True),
    (np.float64, commlib.Sum, 2.0, 0.5, False, False),
    (np.float64, commlib.Sum, 2.0, 0.5, False, True),
    (np.float64, commlib.Sum, 2.0, 0.5, True, False),
]


def rows_of(j, rank):
    """Member j's rows on `rank`: 0 to 3, none on some ranks."""
    return (j + 2 * rank) % 4


def gather_input(j, rank, rnd):
    dt = GATHER_DTYPES[j % len(GATHER_DTYPES)]
    trailing = (j % 3 + 1, 2) if j % 2 else (j % 5 + 1,)
    g = np.random.default_rng(10000 * rnd + 100 * j + rank)
    return g.integers(0, 50, size=(rows_of(j, rank),) + trailing).astype(dt)


def gathers(rnd, members, set_ranks, process_set, tag):
    """Allgathers j = 0..members-1 in flight at once; every result checked."""
    me = set_ranks.index(r)
    handles, outs = [], {}
    wrong = 5 if len(set_ranks) > 1 else -1
    for j in range(members):
        x = gather_input(j, r, rnd)
        out = None
        if j % 3 == 2 or j == wrong:
            rows = sum(rows_of(j, q) for q in set_ranks)
            if j == wrong and me == len(set_ranks) - 1:
                rows += 1  # the last rank's out is too big: that request alone fails there
            out = np.full((rows,) + x.shape[1:], 99, x.dtype)
            outs[j] = out
        handles.append(commlib.allgather_async(x, name=f"{tag}.g{j}", process_set=process_set, out=out))
    for j, h in enumerate(handles):
        want = np.concatenate([gather_input(j, q, rnd) for q in set_ranks])
        if j == wrong and me == len(set_ranks) - 1:
            expect_raises(ValueError, lambda h=h: commlib.synchronize(h), f"{tag} round {rnd}: wrong out",
                          match="out holds")
            continue
        got = commlib.synchronize(h)
        check_equal(got, want, f"{tag} round {rnd}: allgather {j}")
        if j in outs and got is not outs[j] and not np.shares_memory(got, outs[j]):
            fail(f"{tag} round {rnd}: allgather {j} did not return its out")


def rs_input(j, rank, rnd, dim0):
    dt = RS_CASES[j][0]
    g = np.random.default_rng(20000 * rnd + 100 * j + rank)
    return g.integers(0, 8, size=(dim0, 3)).astype(dt)


def rs_splits(j, size):
    return [(j + k) % 3 + (1 if k == 0 else 0) for k in range(size)]


def reducescatters(rnd):
    handles = []
    for j, (dt, op, pre, post, with_splits, in_pieces) in enumerate(RS_CASES):
        splits = rs_splits(j, n) if with_splits else None
        dim0 = sum(splits) if splits else 2 * n + j % 3
        x = rs_input(j, r, rnd, dim0)
        name = f"rs{j}"
        if in_pieces:  # three pieces: rows, zeros where the input is zero, the rest
            x[1] = 0
            flat = x.reshape(-1)
            pieces = [flat[:3].copy(), 3, flat[6:].copy()]
            h = commlib.reducescatter_pieces_async(pieces, x.shape, x.dtype, op=op, name=name,
                                                   prescale_factor=pre, postscale_factor=post)
        else:
            out = None
            if j % 2:
                rows = splits[r] if splits else commlib.ops.reducescatter_rows(dim0)
                out = np.empty((rows, 3), x.dtype)
            h = commlib.reducescatter_async(x, op=op, name=name, prescale_factor=pre,
                                            postscale_factor=post, splits=splits, out=out)
        handles.append((h, x.shape[0], splits))
    for j, (h, dim0, splits) in enumerate(handles):
        dt, op, pre, post, _, in_pieces = RS_CASES[j]
        parts = []
        for q in range(n):
            p = rs_input(j, q, rnd, dim0).astype(np.float64)
            if in_pieces:
                p[1] = 0
            parts.append(p * pre)
        if op == commlib.Max:
            full = np.max(parts, axis=0)
        else:
            full = np.sum(parts, axis=0) / (n if op == commlib.Average else 1)
        full = full * post
        rows = splits or [dim0 // n + (1 if q < dim0 % n else 0) for q in range(n)]
        first = sum(rows[:r])
        want = full[first:first + rows[r]].astype(dt)
        check_equal(commlib.synchronize(h), want, f"round {rnd}: reducescatter {j}",
                    rtol=1e-3 if dt == np.float16 or op == commlib.Average else 0.0)


def in_place_batch(rnd):
    """Allgathers fused whose input lies in their own out: one at its rank's
    place there (in place), one at the start of it (not its place but rank
    0's: read before anything is written, as unfused), one apart."""
    rows = [q + 1 for q in range(n)]  # (rank q's rows)
    lo = sum(rows[:r])
    mine = lambda q: np.arange(rows[q] * 2).reshape(rows[q], 2) + 100 * q + rnd  # noqa: E731 (rows differ)
    whole, front = np.zeros((sum(rows), 2), np.int64), np.zeros((sum(rows), 2), np.int64)
    whole[lo:lo + rows[r]] = mine(r)
    front[:rows[r]] = mine(r)
    hs = [commlib.allgather_async(whole[lo:lo + rows[r]], name="inplace.own", out=whole),
          commlib.allgather_async(front[:rows[r]], name="inplace.front", out=front),
          commlib.allgather_async(mine(r), name="inplace.apart")]
    got = [commlib.synchronize(h) for h in hs]
    want = np.concatenate([mine(q) for q in range(n)])
    check_equal(whole, want, f"round {rnd}: allgather in place")
    check_equal(front, want, f"round {rnd}: allgather whose input is rank 0's place in its out")
    check_equal(got[2], want, f"round {rnd}: allgather fused with those")


everyone = list(range(n))
subset = commlib.ProcessSet(list(range(n - 1))) if n > 2 else None
if subset is not None:
    commlib.add_process_set(subset)
for rnd in range(ROUNDS):
    gathers(rnd, 12, everyone, None, "all")
    in_place_batch(rnd)
    reducescatters(rnd)
    if subset is not None and r in subset.ranks:
        gathers(rnd, 6, subset.ranks, subset, "set")
commlib.barrier()
commlib.stop_timeline()

events = load_events(rank_file(path, r))
fused = {}
for e in events:
    args = e.get("args") or {}
    if args.get("fused_count", 1) > 1:
        fused[e.get("cat") or e.get("name")] = max(fused.get(e.get("cat") or e.get("name"), 0),
                                                   args["fused_count"])
kinds = " ".join(f"{k}:{v}" for k, v in sorted(fused.items()))
for want in ("allgather", "reducescatter"):
    if not any(want in k.lower() for k in fused):
        fail(f"no fused {want} in the timeline (fused: {kinds or 'none'})")
print(f"rank {r}: fused {kinds}", flush=True)
done()
commlib.shutdown()

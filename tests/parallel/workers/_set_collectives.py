"""Collectives of a process set, every kind and several sizes, each member
checking its result against numpy (the values depend on the rank)."""
from __future__ import annotations

import numpy as np

import commlib
from _common import check_equal


def check_set_collectives(ps, tag: str, sizes=(1, 1000, 70000)) -> None:
    members = list(ps.ranks)
    r = commlib.rank()
    me = members.index(r)
    k = len(members)
    for n in sizes:
        x = np.arange(n, dtype=np.float32) + r
        want = sum(np.arange(n, dtype=np.float32) + m for m in members)
        check_equal(commlib.allreduce(x, op=commlib.Sum, name=f"{tag}.ar.{n}", process_set=ps), want,
                    f"allreduce of {n} on {members}")
        rows = [m + 1 for m in members]  # (uneven rows)
        mine = np.full((rows[me], n), r, dtype=np.int64)
        check_equal(commlib.allgather(mine, name=f"{tag}.ag.{n}", process_set=ps),
                    np.concatenate([np.full((rows[i], n), m, dtype=np.int64) for i, m in enumerate(members)]),
                    f"allgather of {n} on {members}")
        root = members[-1]
        check_equal(commlib.broadcast(np.arange(n, dtype=np.float64) * (r + 1), root, name=f"{tag}.bc.{n}",
                                      process_set=ps),
                    np.arange(n, dtype=np.float64) * (root + 1), f"broadcast of {n} from {root} on {members}")
        got = commlib.grouped_allreduce([x, np.full(3, r, dtype=np.int32)], op=commlib.Sum, name=f"{tag}.gr.{n}",
                                        process_set=ps)
        check_equal(got[0], want, f"grouped allreduce of {n} on {members} (member 0)")
        check_equal(got[1], np.full(3, sum(members), dtype=np.int32), f"grouped allreduce on {members} (member 1)")
        parts = np.repeat(np.arange(k, dtype=np.float32) + 10 * r, n)  # n values for each member
        check_equal(commlib.alltoall(parts, name=f"{tag}.a2a.{n}", process_set=ps),
                    np.repeat(np.full(k, me, dtype=np.float32) + 10 * np.array(members, dtype=np.float32), n),
                    f"alltoall of {n} per member on {members}")

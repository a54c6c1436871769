"""Gradients of commlib.torch reducescatter and grouped_reducescatter are
Horovod's, checked on every rank against exact numbers: the allgather (over
the same process set) of the output gradients, times the set's size for
Sum and times prescale_factor * postscale_factor for every op (Average:
no 1/size; Min, Max and Product: the same allgather). Every op, with and
without scale factors, on the global set and on a set of ranks 1..n-1
(positions differ from ranks), single and grouped forms."""
import torch

import commlib.torch as hvd
from _common import done, fail

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
f64 = torch.float64
tail = hvd.add_process_set(list(range(1, n)))  # {1} at 2 ranks, {1, 2} at 3
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}
SCALES = [(1.0, 1.0), (0.5, 1.0), (1.0, 4.0), (0.25, 8.0)]  # powers of 2: exact


def rows_of(dim0, m, pos):
    return dim0 // m + (1 if pos < dim0 % m else 0)


def upstream(k, rows, cols=2):
    """Rank k's output gradient (rank-dependent, exact in float64)."""
    return torch.arange(rows * cols, dtype=f64).reshape(rows, cols) % 5 + 10 * k + 1


def horovod_grad(ranks, dim0, op, pre, post, cols=2):
    """What Horovod's backward gives every member: the members' upstream
    gradients, in set order, times size (Sum only) * pre * post."""
    m = len(ranks)
    scale = (m if op == "Sum" else 1) * pre * post
    return torch.cat([upstream(k, rows_of(dim0, m, i), cols) for i, k in enumerate(ranks)]) * scale


def check(got, want, what):
    if got is None or got.shape != want.shape or not torch.equal(got.to(f64), want):
        fail(f"{what}: got {None if got is None else got.flatten()[:6].tolist()} "
             f"want {want.flatten()[:6].tolist()}")


def run(ps, tag):
    ranks = ps.ranks if ps is not hvd.global_process_set else list(range(n))
    m, pos = len(ranks), ranks.index(r)
    dim0 = 2 * m + 1  # uneven parts
    for opname, op in OPS.items():
        for pre, post in SCALES:
            what = f"{tag} {opname} pre {pre} post {post}"
            x = (torch.arange(dim0 * 2, dtype=f64).reshape(dim0, 2) % 3 + 1).requires_grad_()
            y = hvd.reducescatter(x, op=op, process_set=ps, prescale_factor=pre,
                                  postscale_factor=post)
            (y * upstream(r, y.shape[0])).sum().backward()
            check(x.grad, horovod_grad(ranks, dim0, opname, pre, post), f"reducescatter {what}")

            a = torch.ones(dim0, 2, dtype=f64, requires_grad=True)
            b = torch.ones(m, 3, dtype=f64, requires_grad=True)
            ya, yb = hvd.grouped_reducescatter([a, b], op=op, process_set=ps,
                                               prescale_factor=pre, postscale_factor=post)
            ((ya * upstream(r, ya.shape[0])).sum()
             + (yb * upstream(r, yb.shape[0], 3)).sum()).backward()
            check(a.grad, horovod_grad(ranks, dim0, opname, pre, post),
                  f"grouped_reducescatter[0] {what}")
            check(b.grad, horovod_grad(ranks, m, opname, pre, post, cols=3),
                  f"grouped_reducescatter[1] {what}")
    if pos == 0:
        print(f"rank {r}: {tag}: {len(OPS) * len(SCALES)} op/scale cases at set size {m}",
              flush=True)


run(hvd.global_process_set, "global")
if r in tail.ranks:
    run(tail, "ranks 1..n-1")
hvd.barrier()
done()

"""join() in the frontends, uneven data. torch: rank r has r + 2 batches;
DistributedOptimizer (SGD, and SGD with one grouped pair of layers) trains
on them and joins; the parameters must equal a one-process simulation of the
same rule (each step, the gradients of the ranks still running, summed and
divided by the number of ranks) and be bitwise equal across ranks.
tensorflow: join() returns the last rank as a tensor, eagerly and inside a
tf.function, and a joined rank contributes zeros to the others' allreduce."""
import sys

import numpy as np

from _common import check_equal, done, fail

which = sys.argv[1]


def torch_case():
    import torch
    import torch.nn as nn

    import commlib.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))

    def data(q, step):
        g = torch.Generator().manual_seed(100 * q + step)
        return torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)

    def loss_of(m, q, step):
        x, y = data(q, step)
        return ((m(x) - y) ** 2).mean()

    for grouped in (False, True):
        net = model()
        kw = {"groups": [[net[0].weight, net[0].bias]]} if grouped else {}
        opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                       named_parameters=net.named_parameters(), **kw)
        for step in range(r + 2):
            opt.zero_grad()
            loss_of(net, r, step).backward()
            opt.step()
        last = hvd.join()
        check_equal(np.array(last), np.array(n - 1), "torch join() returned")
        ref = model()
        for step in range(r + 2):  # (a rank's parameters stop where it joined)
            grads = [torch.zeros_like(p) for p in ref.parameters()]
            for q in range(n):
                if step < q + 2:
                    ref.zero_grad()
                    loss_of(ref, q, step).backward()
                    for g, p in zip(grads, ref.parameters()):
                        g += p.grad
            with torch.no_grad():
                for g, p in zip(grads, ref.parameters()):
                    p -= 0.1 * g / n
        for (name, p), q in zip(net.named_parameters(), ref.parameters()):
            err = float((p.detach() - q.detach()).abs().max() / q.detach().abs().max())
            if err > 1e-6:
                fail(f"grouped={grouped}: {name} differs from the simulation by {err:.2e}")
        # The Horovod idiom: the last rank to join has seen every step.
        hvd.broadcast_parameters(net.state_dict(), root_rank=last)
        for name, p in net.named_parameters():
            every = hvd.allgather(p.detach().reshape(1, -1), name=f"check.{grouped}.{name}")
            for k in range(n):
                if not torch.equal(every[k], every[0]):
                    fail(f"grouped={grouped}: {name} differs between rank 0 and rank {k}")
    done()


def tf_case():
    import tensorflow as tf

    import commlib.tensorflow as hvd

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    if r != n - 1:
        got = hvd.allreduce(tf.fill([3], float(r + 1)), op=hvd.Sum, name="tf.join.sum")
        check_equal(got.numpy(), np.full(3, float(sum(q + 1 for q in range(n - 1))), np.float32),
                    "allreduce with the last rank joined")
    last = int(hvd.join().numpy())
    if n > 1 and last == n - 1:  # (it joined first: the others were still reducing)
        fail("tf join() eagerly returned the rank that joined first")

    @tf.function
    def graph_join():
        return hvd.join()

    if r == 0:  # (the others join eagerly)
        last = graph_join()
    else:
        last = hvd.join()
    check_equal(hvd.allgather(tf.reshape(last, [1]), name="lasts").numpy(),
                np.full(n, int(last), np.int32), "every rank got the same last rank")
    done()


torch_case() if which == "torch" else tf_case()

"""PowerSGD's exchange step in numpy, written for the tests independently of
commlib.powersgd: every rank's gradients in one process (the simulations of
torch_powersgd.py and tf_powersgd.py)."""
import numpy as np


def gram_schmidt(a, eps=1e-8):
    a = a.copy()
    for i in range(a.shape[1]):
        a[:, i] /= max(np.linalg.norm(a[:, i]), eps)
        a[:, i + 1:] -= np.outer(a[:, i], a[:, i] @ a[:, i + 1:])
    return a


def exchange(grads, errors, qs, step, rank, start, warm=True, feedback=True, total=False,
             seed=0):
    """The reduced gradients {key: array} of one step. ``grads``: per rank,
    {key: gradient} where key is the tensor's index in the plan (it seeds the
    random Q); ``errors`` (per rank) and ``qs`` are dicts updated in place."""
    reduce = (lambda xs: np.sum(xs, 0)) if total else (lambda xs: np.mean(xs, 0))
    new = {}
    for i in sorted(grads[0]):
        shape = grads[0][i].shape
        rows, cols = shape[0], int(np.prod(shape[1:])) if len(shape) > 1 else 1
        rk = min(rank, rows, cols)
        if step < start or len(shape) < 2 or rows * cols < 2 * (rows + cols) * rk:
            new[i] = reduce([g[i] for g in grads])
            continue
        ms = [g[i].reshape(rows, cols) + (errors[k].get(i, 0.0) if feedback else 0.0)
              for k, g in enumerate(grads)]
        if i not in qs or not warm:
            seq = (seed, i) if warm else (seed, i, step)
            qs[i] = np.random.default_rng(seq).standard_normal((cols, rk))
        p = gram_schmidt(reduce([m @ gram_schmidt(qs[i]) for m in ms]))
        qs[i] = reduce([m.T @ p for m in ms])
        m_hat = p @ qs[i].T
        for k in range(len(grads)):
            errors[k][i] = ms[k] - m_hat
        new[i] = m_hat.reshape(shape)
    return new

"""A numpy implementation of Horovod's Adasum, written from the formula (not
from commlib's code), for the Adasum workers.

Two values combine as acoeff * a + bcoeff * b with acoeff = 1 - a.b / |a|^2 / 2
(1 when |a|^2 < 1e-8) and bcoeff alike, per tensor, in float64. n ranks: with
p the largest power of two <= n and rem = n - p, ranks 2k and 2k+1 (k < rem)
first combine (a = rank 2k); the p values then combine along the
recursive-doubling tree, at level l = 1, 2, 4, .. value v with v ^ l, the
lower one as a (commlib's documented definition; Horovod's for n = p).
"""
import numpy as np


def combine(a, b):
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    dot, an, bn = float(a @ b), float(a @ a), float(b @ b)
    ac = 1.0 - dot / an / 2.0 if an >= 1e-8 else 1.0
    bc = 1.0 - dot / bn / 2.0 if bn >= 1e-8 else 1.0
    return ac * a + bc * b


def adasum(values):
    """Adasum of one tensor over ranks: values[r] is rank r's (any shape);
    the float64 result has the shape of values[0]."""
    shape = np.shape(values[0])
    n = len(values)
    p = 1
    while 2 * p <= n:
        p *= 2
    rem = n - p
    vals = [combine(values[2 * k], values[2 * k + 1]) for k in range(rem)]
    vals += [np.asarray(v, dtype=np.float64).ravel() for v in values[2 * rem:]]
    level = 1
    while level < p:
        vals = [combine(vals[min(v, v ^ level)], vals[max(v, v ^ level)]) for v in range(p)]
        level *= 2
    return vals[0].reshape(shape)

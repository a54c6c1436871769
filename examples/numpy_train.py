"""Data-parallel training with commlib's numpy API: a 2-layer MLP classifier
on a synthetic task, gradients averaged across ranks every step.

    commlibrun -np 2 python examples/numpy_train.py

Each rank draws its own shard of a fixed synthetic data set, computes
gradients on it, and averages them with one grouped allreduce; rank 0's
initial weights are broadcast so every rank starts (and stays) identical.
"""
import argparse
import time

import numpy as np

import commlib


def make_data(n_samples, n_features, n_classes, seed=0):
    """Gaussian blobs: a learnable classification task, identical on every rank."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 0.6, size=(n_classes, n_features))
    y = rng.integers(0, n_classes, size=n_samples)
    x = centers[y] + rng.normal(0, 2.0, size=(n_samples, n_features))
    return x.astype(np.float32), y


def forward(params, x):
    w1, b1, w2, b2 = params
    h = np.maximum(x @ w1 + b1, 0)
    logits = h @ w2 + b2
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    return h, p


def gradients(params, x, y):
    w1, b1, w2, b2 = params
    h, p = forward(params, x)
    n = x.shape[0]
    loss = -np.log(p[np.arange(n), y] + 1e-12).mean()
    d = p.copy()
    d[np.arange(n), y] -= 1
    d /= n
    gw2, gb2 = h.T @ d, d.sum(0)
    dh = (d @ w2.T) * (h > 0)
    gw1, gb1 = x.T @ dh, dh.sum(0)
    return loss, [gw1, gb1, gw2, gb2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    commlib.init()
    rank, size = commlib.rank(), commlib.size()
    x, y = make_data(16384, 64, 10)
    shard = slice(rank, None, size)  # each rank trains on its own shard
    xs, ys = x[shard], y[shard]

    rng = np.random.default_rng(1234 + rank)  # deliberately different per rank ...
    params = [rng.normal(0, 0.1, (64, 128)).astype(np.float32), np.zeros(128, np.float32),
              rng.normal(0, 0.1, (128, 10)).astype(np.float32), np.zeros(10, np.float32)]
    for i, p in enumerate(params):  # ... until rank 0's weights are broadcast
        commlib.broadcast_(p, root_rank=0, name=f"init.{i}")

    steps = len(xs) // args.batch_size
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        losses = []
        for s in range(steps):
            b = slice(s * args.batch_size, (s + 1) * args.batch_size)
            loss, grads = gradients(params, xs[b], ys[b])
            commlib.grouped_allreduce_(grads, op=commlib.Average, name="grads")
            for p, g in zip(params, grads):
                p -= args.lr * g
            losses.append(loss)
        elapsed = time.perf_counter() - t0
        mean_loss = commlib.allreduce(np.array([np.mean(losses)]), op=commlib.Average, name=f"loss.{epoch}")[0]
        acc = (forward(params, x)[1].argmax(1) == y).mean()
        if rank == 0:
            print(f"epoch {epoch}: loss {mean_loss:.4f}  accuracy {acc:.3f}  "
                  f"{steps * args.batch_size * size / elapsed:,.0f} samples/s on {size} ranks", flush=True)

    # Every rank must hold exactly the same model.
    flat = np.concatenate([p.ravel() for p in params])
    same = commlib.allreduce(flat, op=commlib.Max, name="check.max")
    if not np.array_equal(same, flat):
        raise SystemExit(f"rank {rank}: parameters differ across ranks")
    if rank == 0:
        print("parameters identical on all ranks", flush=True)


if __name__ == "__main__":
    main()

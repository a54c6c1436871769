"""Data-parallel training of a small MLP with commlib.torch.DistributedOptimizer.

The task is synthetic and deterministic (a mixture of Gaussian clusters per
class, see make_data), so there is something real to learn and no data set
to download. Every rank builds the same data and
trains on its own shard of each epoch's shuffle.

    commlibrun -np 2 python examples/pytorch_train.py
    commlibrun -np 2 python examples/pytorch_train.py --epochs 10 --fp16-allreduce

(``python -m commlib.launch`` is the same as ``commlibrun``.) The script is
written as for Horovod: replacing ``commlib.torch`` by ``horovod.torch``
in the import gives the Horovod version.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import commlib.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.005, help="learning rate for one rank "
                   "(scaled by the number of ranks)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--train-samples", type=int, default=16384)
    p.add_argument("--test-samples", type=int, default=4096)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--clusters", type=int, default=8, help="Gaussian clusters per class")
    p.add_argument("--noise", type=float, default=1.3, help="cluster spread")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16")
    p.add_argument("--batches-per-allreduce", type=int, default=1,
                   help="gradient accumulation: backward passes per allreduce")
    p.add_argument("--num-threads", type=int, default=1, help="torch threads per rank")
    return p.parse_args()


def make_data(args):
    """Deterministic data, the same on every rank: each class is a mixture of
    Gaussian clusters whose centres interleave with other classes', so the
    boundary is non-linear and the classes overlap somewhat."""
    g = torch.Generator().manual_seed(args.seed)
    centres = torch.randn(args.classes * args.clusters, args.features, generator=g) * 0.6

    def sample(count):
        k = torch.randint(0, len(centres), (count,), generator=g)
        x = centres[k] + torch.randn(count, args.features, generator=g) * 0.6 * args.noise
        return x, k % args.classes

    x_train, y_train = sample(args.train_samples)
    x_test, y_test = sample(args.test_samples)
    return x_train, y_train, x_test, y_test


class Net(nn.Module):
    def __init__(self, features, hidden, classes):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(float(value)), name=name).item()


def main():
    args = parse_args()
    hvd.init()
    torch.set_num_threads(args.num_threads)
    torch.manual_seed(args.seed)

    x_train, y_train, x_test, y_test = make_data(args)
    model = Net(args.features, args.hidden, args.classes)
    # Scale the learning rate by the number of ranks: the global batch is size() times larger.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(),
                                momentum=args.momentum)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         backward_passes_per_step=args.batches_per_allreduce)
    # Start every rank from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    if hvd.rank() == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"{hvd.size()} rank(s), model {params:,} parameters, batch {args.batch_size} per "
              f"rank, {args.train_samples} training samples", flush=True)

    test_shard = slice(hvd.rank(), None, hvd.size())
    accuracies = []
    for epoch in range(1, args.epochs + 1):
        model.train()
        # Same shuffle on every rank (seeded by epoch); each rank takes its shard.
        order = torch.randperm(args.train_samples, generator=torch.Generator().manual_seed(epoch))
        shard = order[hvd.rank()::hvd.size()]
        step_rows = args.batch_size * args.batches_per_allreduce
        steps = len(shard) // step_rows  # the same on every rank
        total_loss, seen = 0.0, 0
        start = time.perf_counter()
        for step in range(steps):
            optimizer.zero_grad()
            for micro in range(args.batches_per_allreduce):
                lo = step * step_rows + micro * args.batch_size
                idx = shard[lo:lo + args.batch_size]
                loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
                loss.backward()
                total_loss += loss.item() * len(idx)
                seen += len(idx)
            optimizer.step()
        elapsed = time.perf_counter() - start

        model.eval()
        with torch.no_grad():
            pred = model(x_test[test_shard]).argmax(1)
            correct = (pred == y_test[test_shard]).sum().item()
        accuracy = hvd.allreduce(torch.tensor(float(correct)), op=hvd.Sum,
                                 name="test.correct").item() / args.test_samples
        train_loss = metric_average(total_loss / max(seen, 1), "train.loss")
        samples_per_s = hvd.allreduce(torch.tensor(seen / elapsed), op=hvd.Sum,
                                      name="samples_per_s").item()
        accuracies.append(accuracy)
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {train_loss:.4f}  test accuracy {accuracy:.3f}  "
                  f"{samples_per_s:,.0f} samples/s  ({elapsed:.2f} s)", flush=True)

    if hvd.rank() == 0 and len(accuracies) > 1:
        print(f"accuracy {accuracies[0]:.3f} -> {accuracies[-1]:.3f}", flush=True)


if __name__ == "__main__":
    main()

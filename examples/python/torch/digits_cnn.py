"""A small CNN on scikit-learn's handwritten digits, trained data-parallel with synkv.torch.

The 1,797 8x8 digit images bundled with scikit-learn (``load_digits``, nothing is downloaded)
are split once, with a fixed seed, into 1,347 training and 450 test images. Every worker
trains on its shard ``train[rank::size]`` of the training set; gradients are averaged over the
workers by ``synkv.torch.DistributedOptimizer`` (pushed from backward hooks while backward
runs). With ``--server-optimizer`` the optimizer runs on the servers instead
(``synkv.optimizer.SGD``/``Adam``): workers push gradients and pull the new weights.

Run it with two workers and one server (``dist_sync``)::

    synkv launch -n 2 -s 1 -- python examples/python/torch/digits_cnn.py
    synkv launch -n 2 -s 1 -- python examples/python/torch/digits_cnn.py --server-optimizer

or as one process (a ``local`` store, nothing to launch)::

    python examples/python/torch/digits_cnn.py

Goal: test accuracy >= 0.95 (``--target``); the script exits with status 1 below it. Rank 0's last
line is ``final accuracy X.XXXX``. Measured on a shared 2-core machine
(2026-12-02, torch 1.13 CPU, defaults: 15 epochs, batch 32 per worker, SGD momentum 0.9,
lr 0.05, not scaled with the number of workers):

* one process, ``local`` store: 0.9889, and 0.9889 with ``--server-optimizer``;
* 2 workers, 1 server, ``dist_sync``: 0.9800 (two runs), and 0.9800 with
  ``--server-optimizer`` (two runs: server-side SGD with momentum is the same arithmetic as
  torch's, so both modes follow the same trajectory); ``--optimizer adam``: 0.9778 on the
  workers, 0.9800 on the servers. 9-14 s per job including start-up (3-6 s of training).
"""

import argparse
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import synkv
import synkv.torch as skv


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=15, help="passes over the training set (default 15)")
    ap.add_argument("--batch-size", type=int, default=32, help="examples per worker per step (default 32)")
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd", help="default sgd (momentum 0.9)")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: 0.05 for sgd, 0.002 for adam)")
    ap.add_argument("--server-optimizer", action="store_true", help="run the optimizer on the servers (synkv.optimizer)")
    ap.add_argument("--target", type=float, default=0.95, help="test accuracy to reach (default 0.95)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the split, the init and the shuffling (default 0)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    return ap.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)  # 8x8 -> 8x8
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)  # 8x8 -> 8x8, pooled to 4x4
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    skv.init()  # dist_sync under a launcher, local otherwise
    rank, size = skv.rank(), skv.size()

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8), in [0, 1]
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=args.seed, stratify=digits.target)
    x_train, y_train = torch.from_numpy(x_train[rank::size]), torch.from_numpy(y_train[rank::size])
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    model = Net()
    # Every worker must take the same number of steps per epoch under dist_sync (each step is
    # a collective round): the smallest shard decides.
    n_train = len(digits.target) - len(y_test)
    steps = (n_train // size) // args.batch_size

    skv.broadcast_parameters(model.state_dict(), root_rank=0)
    if args.server_optimizer:
        lr = args.lr or (0.05 if args.optimizer == "sgd" else 0.002)
        if args.optimizer == "sgd":
            server_opt = synkv.optimizer.SGD(learning_rate=lr, momentum=0.9)
        else:
            server_opt = synkv.optimizer.Adam(learning_rate=lr)
        opt = skv.DistributedOptimizer(server_opt, named_parameters=model.named_parameters())
    else:
        if args.optimizer == "sgd":
            lr = args.lr or 0.05
            torch_opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        else:
            lr = args.lr or 0.002
            torch_opt = torch.optim.Adam(model.parameters(), lr=lr)
        opt = skv.DistributedOptimizer(torch_opt, named_parameters=model.named_parameters())
        skv.broadcast_optimizer_state(opt, root_rank=0)

    where = "servers" if args.server_optimizer else "workers"
    if rank == 0:
        print(f"{size} worker(s), store {skv.store().type}, {args.optimizer} lr {lr} on the {where}, "
              f"{steps} steps/epoch of {args.batch_size} per worker", flush=True)

    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(y_train), generator=g)
        total = 0.0
        for s in range(steps):
            idx = perm[s * args.batch_size : (s + 1) * args.batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
            total += loss.item()
        acc = evaluate(model, x_test, y_test)
        if rank == 0:
            print(f"epoch {epoch + 1:2d}  train loss {total / steps:.4f}  test accuracy {acc:.4f}", flush=True)
    elapsed = time.perf_counter() - t0

    acc = evaluate(model, x_test, y_test)
    skv.shutdown()
    if rank == 0:
        print(f"training took {elapsed:.1f} s")
        print(f"final accuracy {acc:.4f}", flush=True)
    if acc < args.target:
        print(f"rank {rank}: test accuracy {acc:.4f} is below the target {args.target}", file=sys.stderr)
        return 1
    return 0


@torch.no_grad()
def evaluate(model, x, y):
    model.eval()
    return (model(x).argmax(1) == y).float().mean().item()


if __name__ == "__main__":
    sys.exit(main())

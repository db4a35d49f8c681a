"""Logistic regression trained through a synkv store.

Synthetic data, gradients computed with numpy on two simulated devices (each takes half of a
worker's share of a mini-batch); the store sums the gradients of each key and SGD applies
them, as MXNet's `update_on_kvstore` training does. Prints the loss per epoch and the final
accuracy.

    python examples/python/train_logreg.py                      # a `local` store
    synkv launch -n 2 -s 1 -- python examples/python/train_logreg.py --store dist_sync

With a dist store every worker generates the same data, takes its share of every mini-batch,
and SGD runs on the servers (`set_optimizer`); the local store runs the same SGD as a Python
updater.
"""

import argparse

import numpy as np

import synkv

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--store", default="local", help="store type (default local; dist_sync under synkv launch)")
args = ap.parse_args()

rng = np.random.default_rng(0)
n, dim, devices, batch, epochs, lr = 4000, 20, 2, 100, 10, 0.5

# Data: labels from a hidden linear model plus noise.
true_w = rng.normal(size=dim).astype(np.float32)
x = rng.normal(size=(n, dim)).astype(np.float32)
y = ((x @ true_w + 0.5 + 0.3 * rng.normal(size=n)) > 0).astype(np.float32)

kv = synkv.create(args.store)
rank, workers = kv.rank, kv.num_workers
params = {"weight": np.zeros(dim, np.float32), "bias": np.zeros(1, np.float32)}
kv.init(list(params), list(params.values()))


def sgd(key, grad, weight):
    """The updater: `grad` is the sum over devices of per-example-summed gradients."""
    weight -= lr / batch * grad


if args.store.startswith("dist"):
    # The same step on the servers: w -= lr * (g / batch).
    kv.set_optimizer(synkv.optimizer.SGD(learning_rate=lr, rescale_grad=1.0 / batch))
else:
    kv.set_updater(sgd)


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def loss_and_accuracy(w, b):
    p = sigmoid(x @ w + b)
    eps = 1e-7
    loss = -np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))
    return float(loss), float(np.mean((p > 0.5) == y))


# One weight copy and one gradient buffer per device, reused every step (pulls write into the
# weight copies in place; pushes read the gradient buffers without copying).
weights = [{k: v.copy() for k, v in params.items()} for _ in range(devices)]
grads = [{k: np.zeros_like(v) for k, v in params.items()} for _ in range(devices)]
keys = list(params)

losses = [loss_and_accuracy(params["weight"], params["bias"])[0]]
print(f"epoch  0  loss {losses[0]:.4f}")
for epoch in range(epochs):
    order = rng.permutation(n)
    for start in range(0, n, batch):
        mine = np.array_split(order[start : start + batch], workers)[rank]
        idx = np.array_split(mine, devices)
        for d in range(devices):
            xb, yb = x[idx[d]], y[idx[d]]
            err = sigmoid(xb @ weights[d]["weight"] + weights[d]["bias"]) - yb
            grads[d]["weight"][:] = xb.T @ err
            grads[d]["bias"][:] = err.sum()
        # per key, the list of per-device gradients: summed, then the updater runs
        kv.push(keys, [[g[k] for g in grads] for k in keys])
        kv.pull(keys, out=[[w[k] for w in weights] for k in keys])
    loss, acc = loss_and_accuracy(weights[0]["weight"], weights[0]["bias"])
    losses.append(loss)
    print(f"epoch {epoch + 1:2d}  loss {loss:.4f}  accuracy {acc:.3f}")

final_loss, final_acc = loss_and_accuracy(weights[0]["weight"], weights[0]["bias"])
print(f"final accuracy {final_acc:.3f} (loss {losses[0]:.4f} -> {final_loss:.4f})")
assert losses[-1] < losses[0], "the loss should go down"
kv.close()

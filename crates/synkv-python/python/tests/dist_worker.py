"""One worker of the distributed tests (spec K11 T24, T30, T35), run by test_dist.py under
`synkv launch -n N -s S`. Exits non-zero (with a message) on the first wrong value."""

import sys
import warnings

import numpy as np

import synkv

RATE = 2.0
NREPEAT = 3


def check(arr, want, what):
    arr = np.asarray(arr, dtype=np.float64)
    if not np.allclose(arr, want, rtol=1e-3 if arr.dtype == np.float16 else 1e-6):
        sys.exit(f"rank {kv.rank}: {what}: expected {want}, got {arr.ravel()[:4]}")


kv = synkv.create("dist_sync")
rank, n = kv.rank, kv.num_workers
assert kv.type.startswith("dist"), kv.type

# T35 (no optimizer): broadcast [ones*i] → i; in-place pushpull of 2 devices × (rank+1) → the
# plain sum over workers, n(n+1), on every repetition.
keys = [str(k) for k in range(200, 204)]
outs = [np.zeros((2, 3), np.float32) for _ in keys]
kv.broadcast(keys, [np.ones((2, 3), np.float32) * i for i in range(len(keys))], out=outs)
for i, o in enumerate(outs):
    check(o, i, f"T35 broadcast key {keys[i]}")
kv.init("300", np.zeros((2, 3), np.float32))
for i in range(NREPEAT):
    vals = [np.full((2, 3), rank + 1, np.float32) for _ in range(2)]
    kv.pushpull("300", vals)
    for v in vals:
        check(v, n * (n + 1), f"T35 pushpull repeat {i}")

# T30 init: keys initialised with [ones*i] pull i (float32 and float16, big and small).
keys = ["400", "401", "402", "403"]
shapes = [(2, 3), (2, 3), (1200, 1200), (1200, 1200)]
dtypes = [np.float32, np.float16, np.float32, np.float16]
kv.init(keys, [np.ones(s, d) * (i + 1) for i, (s, d) in enumerate(zip(shapes, dtypes))])
outs = [np.zeros(s, d) for s, d in zip(shapes, dtypes)]
kv.pull(keys, out=outs)
for i, o in enumerate(outs):
    check(o, i + 1, f"T30 init key {keys[i]}")

# set_updater has no effect on a dist store: it warns (updates run on the servers).
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    kv.set_updater(lambda key, recv, stored: None)
if not any("set_optimizer" in str(w.message) for w in caught):
    sys.exit(f"rank {rank}: set_updater on a dist store did not warn")

# push returns once its arrays are consumed, before the round completes (which needs every
# worker's push): rank 0 pushes and overwrites its array, and only then lets the others push.
# Were push to wait for the servers' answer, rank 0 would never reach the barrier.
kv.init("release", np.zeros((64, 64), np.float32))
g = np.full((64, 64), rank + 1, np.float32)
if rank == 0:
    kv.push("release", g)
    g[:] = -100.0
kv.barrier()
if rank != 0:
    kv.push("release", g)
out = np.zeros((64, 64), np.float32)
kv.pull("release", out=out)
check(out, n * (n + 1) / 2, "push returned before the round completed")

# T24: the Test optimizer `w += rate * g`; worker r pushes ones*(r+1) each repeat →
# 1 + rate * n(n+1)/2 * (i+1), for small and big keys, float32 and float16.
kv.set_optimizer(synkv.optimizer.Test(rescale_grad=RATE))
keys = ["3", "4", "99", "100"]
kv.init(keys, [np.ones(s, d) for s, d in zip(shapes, dtypes)])
for i in range(NREPEAT):
    kv.push(keys, [np.ones(s, d) * (rank + 1) for s, d in zip(shapes, dtypes)])
    outs = [np.zeros(s, d) for s, d in zip(shapes, dtypes)]
    kv.pull(keys, out=outs)
    for k, o in zip(keys, outs):
        check(o, 1 + RATE * n * (n + 1) / 2 * (i + 1), f"T24 key {k} repeat {i}")

# Gradient compression on a dist store (spec K7.10): 2-bit, threshold 0.5; 0.75 from every
# worker is sent as +0.5 (residual 0.25), so w += rate * 0.5 * n.
kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
kv.init("compressed", np.zeros((1200, 1200), np.float32))
kv.push("compressed", np.full((1200, 1200), 0.75, np.float32))
out = np.zeros((1200, 1200), np.float32)
kv.pull("compressed", out=out)
check(out, RATE * 0.5 * n, "2-bit compressed push")

kv.barrier()
if "--no-close" not in sys.argv:
    kv.close()  # else: the exit hook closes it
print(f"worker {rank} of {n}: ok")

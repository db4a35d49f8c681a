#!/usr/bin/env python3
"""MXNet 1.9.1 side of the synkv local-KVStore peer comparison.

Mirrors `synkv bench local` case for case: per timed iteration

    kv.push(keys, vals)        # M keys, each a list of K per-device arrays of N f32
    kv.pull(keys, out=outs)    # M keys, each into K output arrays
    mx.nd.waitall()            # wait for the engine to finish everything

timed with time.perf_counter(); warmup iterations are excluded. With --json one
JSON object is printed on one line, same schema as synkv's, with "impl":"mxnet"
(plus one extra field, "store": "local" | "device").

After the timed loop the pulled outputs are checked against the value the
kvstore must hold (assign: K, the sum of K pushed ones; sgd: the closed-form
SGD-with-momentum recurrence), so the timing is known to be of real work.
--check runs only a small correctness check and exits.

Environment variables this script sets (before importing mxnet; each only if
it is NOT already set, so an explicit value in the environment always wins):

    OMP_NUM_THREADS  = number of CPUs this process may run on
                       (len(os.sched_getaffinity(0)), i.e. the machine default)
    MKL_NUM_THREADS  = same value (MXNet 1.9.1 pip wheels use OpenBLAS + oneDNN,
                       not MKL, so this is only for completeness)

Deliberately left untouched:

    MXNET_ENGINE_TYPE               (default: ThreadedEnginePerDevice)
    MXNET_CPU_WORKER_NTHREADS       (engine CPU worker pool, default 1)
    MXNET_KVSTORE_REDUCTION_NTHREADS, MXNET_KVSTORE_BIGARRAY_BOUND
                                    (CommCPU reduce parallelism, defaults 4 / 1e6)
    OPENBLAS_CORETYPE / OPENBLAS_*  (no BLAS is involved in these ops)
"""

import argparse
import json
import os
import statistics
import sys
import time

_NCPU = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
os.environ.setdefault("OMP_NUM_THREADS", str(_NCPU))
os.environ.setdefault("MKL_NUM_THREADS", str(_NCPU))

import mxnet as mx  # noqa: E402  (must come after the env setup above)
import numpy as np  # noqa: E402

LR = 0.1
MOMENTUM = 0.9


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--size", type=int, default=16777216, help="f32 elements per array (N)")
    p.add_argument("--devices", type=int, default=2, help="per-key arrays pushed/pulled, on mx.cpu(0..K-1)")
    p.add_argument("--keys", type=int, default=1, help="number of keys (M), ints 0..M-1")
    p.add_argument("--updater", choices=["assign", "sgd"], default="assign",
                   help="assign = no updater (store := sum of pushes); sgd = SGD lr 0.1 momentum 0.9")
    p.add_argument("--iters", type=int, default=20, help="timed iterations")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations before timing")
    p.add_argument("--dtype", choices=["f32"], default="f32", help="only f32 (for CLI parity with synkv)")
    p.add_argument("--store", choices=["local", "device"], default="local", help="mx.kv.create(<store>)")
    p.add_argument("--json", action="store_true", help="print one JSON object on one line")
    p.add_argument("--check", action="store_true", help="run a small correctness check only, then exit")
    p.add_argument("--no-verify", action="store_true", help="skip verifying pulled values after timing")
    a = p.parse_args(argv)
    for name in ("size", "devices", "keys", "iters"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    return a


def make_store(store, updater):
    kv = mx.kv.create(store)
    if updater == "sgd":
        kv.set_optimizer(mx.optimizer.SGD(learning_rate=LR, momentum=MOMENTUM))
    return kv


def setup(size, devices, keys, store, updater):
    kv = make_store(store, updater)
    key_list = list(range(keys))
    kv.init(key_list, [mx.nd.zeros((size,), ctx=mx.cpu(0), dtype="float32") for _ in key_list])
    ctxs = [mx.cpu(i) for i in range(devices)]
    vals = [[mx.nd.ones((size,), ctx=c, dtype="float32") for c in ctxs] for _ in key_list]
    outs = [[mx.nd.zeros((size,), ctx=c, dtype="float32") for c in ctxs] for _ in key_list]
    mx.nd.waitall()
    return kv, key_list, vals, outs


def step(kv, key_list, vals, outs):
    kv.push(key_list, vals)
    kv.pull(key_list, out=outs)
    mx.nd.waitall()


def expected_value(updater, devices, steps):
    """Value every stored element must have after `steps` push rounds of ones from `devices` devices."""
    grad = np.float32(devices)  # the local store sums the K pushed arrays before updating
    if updater == "assign":
        return float(grad)
    # MXNet sgd_mom_update (wd=0, rescale_grad=1, no clipping):
    #   mom = momentum*mom - lr*grad ; w = w + mom
    w = np.float32(0.0)
    mom = np.float32(0.0)
    lr, m = np.float32(LR), np.float32(MOMENTUM)
    for _ in range(steps):
        mom = m * mom - lr * grad
        w = w + mom
    return float(w)


def verify(outs, updater, devices, steps):
    want = expected_value(updater, devices, steps)
    for k, per_dev in enumerate(outs):
        for d, arr in enumerate(per_dev):
            got = arr.asnumpy()
            if not np.allclose(got, want, rtol=1e-5, atol=1e-6):
                bad = int(np.argmax(~np.isclose(got, want, rtol=1e-5, atol=1e-6)))
                raise AssertionError(
                    f"key {k} device {d}: element {bad} = {got[bad]!r}, expected {want!r} "
                    f"(updater={updater}, devices={devices}, steps={steps})")
    return want


def run_check(store):
    """Small self-check: assign sums pushes; sgd follows the momentum recurrence."""
    results = []
    for updater, devices, keys, steps in (("assign", 2, 3, 1), ("assign", 1, 2, 2),
                                          ("sgd", 2, 2, 3), ("sgd", 1, 1, 1)):
        kv, key_list, vals, outs = setup(1000, devices, keys, store, updater)
        for _ in range(steps):
            step(kv, key_list, vals, outs)
        want = verify(outs, updater, devices, steps)
        results.append(f"{updater} devices={devices} keys={keys} steps={steps}: all pulled = {want:g} OK")
    return results


def main(argv=None):
    a = parse_args(argv)
    if a.check:
        for line in run_check(a.store):
            print(line)
        return 0

    kv, key_list, vals, outs = setup(a.size, a.devices, a.keys, a.store, a.updater)
    for _ in range(a.warmup):
        step(kv, key_list, vals, outs)
    times = []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        step(kv, key_list, vals, outs)
        times.append(time.perf_counter() - t0)

    if not a.no_verify:
        verify(outs, a.updater, a.devices, a.warmup + a.iters)

    med = statistics.median(times)
    nbytes = a.keys * a.size * 4 * (a.devices + a.devices)  # pushed + pulled
    rec = {
        "impl": "mxnet",
        "case": f"local size={a.size} devices={a.devices} keys={a.keys} updater={a.updater}",
        "size": a.size,
        "devices": a.devices,
        "keys": a.keys,
        "updater": a.updater,
        "dtype": a.dtype,
        "iters": a.iters,
        "median_ms": med * 1e3,
        "min_ms": min(times) * 1e3,
        "max_ms": max(times) * 1e3,
        "gbps": nbytes / med / 1e9,
        "store": a.store,
    }
    if a.json:
        print(json.dumps(rec), flush=True)
    else:
        print(f"mxnet[{a.store}] {rec['case']} iters={a.iters} warmup={a.warmup}: "
              f"median {rec['median_ms']:.3f} ms  min {rec['min_ms']:.3f}  max {rec['max_ms']:.3f}  "
              f"{rec['gbps']:.2f} GB/s  (OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

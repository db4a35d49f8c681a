#!/usr/bin/env python3
"""Generate the expected optimizer numbers that synkv's optimizer tests compare against.

MXNet 1.9.1 (with numpy 1.23.5) is the oracle. It is never a dependency of synkv: this
script only runs when the expected values have to be regenerated, and its output is
committed as `crates/synkv/src/optimizer/oracle_cases.rs`.

How to run (from the repository root, with a Python that has `mxnet==1.9.1`):

    python3 -m venv .venv-mxnet && .venv-mxnet/bin/pip install mxnet==1.9.1 numpy==1.23.5
    .venv-mxnet/bin/python crates/synkv/tests/oracle/gen_optimizer_cases.py \
        > crates/synkv/src/optimizer/oracle_cases.rs
    cargo fmt

What it produces (all as Rust `const`s; see the struct definitions printed at the top):

* `DENSE_CASES`: for every optimizer, 3-5 updates through `mx.optimizer.get_updater`
  (exactly the path a KVStore updater takes) on small float32 arrays, with non-trivial
  hyper-parameters (wd, rescale_grad, clip_gradient chosen so that clipping triggers,
  momentum/betas, lr schedulers with warm-up, lr_mult/wd_mult on one key,
  begin_num_update). Each step records the weight after the update.
* `SPARSE_CASES`: row_sparse gradients on a dense 5x3 weight for SGD (with and without
  momentum), Adam, AdaGrad and FTRL, lazy and standard.
* `HALF_CASES`: float16 weights with `multi_precision=True` (SGD with momentum, and Adam
  through the generic master-copy path), as raw f16 bits plus the float32 master copy.
* `SCHED_CASES`: `mx.lr_scheduler.*` values at consecutive num_update points.

Every case also carries the synkv optimizer description (JSON) that must reproduce it,
so the mapping from MXNet's constructor arguments to synkv's config is written down here.

Notes on MXNet 1.9.1 behaviour the cases rely on (see docs/optimizers.md):

* AdamW has no optimizer class in 1.9.1; the case drives the 1.9.1 operator
  `mx.nd.contrib.adamw_update` the way MXNet 2.0's `AdamW` optimizer does
  (bias-corrected lr passed as `eta`, `lr=1`).
* FTRL only updates lazily when the *weight* is row_sparse; with a dense weight MXNet falls
  back to the dense kernel. The lazy case therefore uses a row_sparse weight and the
  standard case a dense one.
* AdaGrad and FTRL have no `lazy_update` switch in MXNet; synkv's `lazy_update=false`
  for them is defined as "the dense update on the densified gradient", which is what the
  standard cases compute.
"""
import json
import math
import sys

import numpy as np
import mxnet as mx

assert mx.__version__ == "1.9.1", mx.__version__

OUT = []


def emit(s=""):
    OUT.append(s)


def f32(x):
    """Rust literal that parses back to exactly this float32."""
    x = float(np.float32(x))
    if not math.isfinite(x):
        raise ValueError("non-finite value in oracle output")
    s = "%.9g" % x
    if "e" not in s and "." not in s:
        s += ".0"
    return s


def f64(x):
    s = repr(float(x))
    if "e" not in s and "." not in s:
        s += ".0"
    return s


def arr32(a):
    return "&[" + ", ".join(f32(v) for v in np.asarray(a, dtype=np.float32).ravel()) + "]"


def arr_u16(a):
    return "&[" + ", ".join("0x%04x" % int(v) for v in np.asarray(a).ravel()) + "]"


def arr_i64(a):
    return "&[" + ", ".join(str(int(v)) for v in a) + "]"


def rstr(s):
    return "r#\"" + s + "\"#"


RNG = np.random.RandomState(20240917)


def grads(n, count, scale=1.5):
    """Gradients with a few entries large enough that clipping triggers."""
    out = []
    for _ in range(count):
        g = (RNG.uniform(-1.0, 1.0, size=n) * scale).astype(np.float32)
        g[RNG.randint(0, n)] = np.float32(2.5 * (1 if RNG.rand() < 0.5 else -1))
        out.append(g)
    return out


def weights(n, scale=1.0):
    return (RNG.uniform(-1.0, 1.0, size=n) * scale).astype(np.float32)


def common(**kw):
    """synkv `Common` JSON object from MXNet keyword names."""
    c = {}
    for k, v in kw.items():
        c[k] = v
    return c


# --------------------------------------------------------------------------------------
# Dense cases through mx.optimizer.get_updater
# --------------------------------------------------------------------------------------

DENSE = []


def dense_case(name, make_opt, cfg, init, steps):
    """init: {int key: np.array}; steps: [(int key, grad)]"""
    opt = make_opt()
    up = mx.optimizer.get_updater(opt)
    w = {k: mx.nd.array(v, dtype="float32") for k, v in init.items()}
    rec = []
    for k, g in steps:
        up(k, mx.nd.array(g, dtype="float32"), w[k])
        rec.append((str(k), g, w[k].asnumpy().copy()))
    DENSE.append((name, json.dumps(cfg), [(str(k), v) for k, v in init.items()], rec))


def interleave(keys, per_key, n):
    gs = {k: grads(n, per_key) for k in keys}
    return [(k, gs[k][i]) for i in range(per_key) for k in keys]


N = 7

# SGD with momentum, clipping, wd, rescale, factor scheduler with linear warm-up,
# lr_mult / wd_mult on key 1.
def _sgd1():
    sch = mx.lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=0.1, warmup_steps=2,
                                          warmup_begin_lr=0.02, warmup_mode="linear")
    o = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5,
                         clip_gradient=0.8, lr_scheduler=sch)
    o.set_lr_mult({1: 0.5})
    o.set_wd_mult({1: 2.0})
    return o


dense_case("sgd_momentum_clip_factor_warmup", _sgd1,
           {"name": "sgd", "momentum": 0.9,
            "common": common(learning_rate=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=0.8,
                             lr_mult={"1": 0.5}, wd_mult={"1": 2.0},
                             lr_scheduler={"schedule": {"type": "factor", "step": 2,
                                                        "factor": 0.5,
                                                        "stop_factor_lr": 1e-8},
                                           "warmup": {"steps": 2, "begin_lr": 0.02,
                                                      "mode": "linear"}})},
           {0: weights(N), 1: weights(N)}, interleave([0, 1], 5, N))

# SGD without momentum, no clipping, begin_num_update and a multi-factor scheduler.
dense_case("sgd_plain_begin_num_update_multifactor",
           lambda: mx.optimizer.SGD(learning_rate=0.05, wd=0.001, rescale_grad=2.0,
                                    begin_num_update=3,
                                    lr_scheduler=mx.lr_scheduler.MultiFactorScheduler(
                                        step=[5, 6], factor=0.3, base_lr=0.05)),
           {"name": "sgd", "momentum": 0.0,
            "common": common(learning_rate=0.05, wd=0.001, rescale_grad=2.0, begin_num_update=3,
                             lr_scheduler={"schedule": {"type": "multi_factor", "steps": [5, 6],
                                                        "factor": 0.3}})},
           {0: weights(N)}, [(0, g) for g in grads(N, 5)])

# SGD with momentum, no clipping (the other kernel branch).
dense_case("sgd_momentum_noclip",
           lambda: mx.optimizer.SGD(learning_rate=0.2, momentum=0.5, wd=0.05, rescale_grad=0.25),
           {"name": "sgd", "momentum": 0.5,
            "common": common(learning_rate=0.2, wd=0.05, rescale_grad=0.25)},
           {0: weights(N)}, [(0, g) for g in grads(N, 4)])

dense_case("nag_momentum_clip",
           lambda: mx.optimizer.NAG(learning_rate=0.1, momentum=0.8, wd=0.02, rescale_grad=0.7,
                                    clip_gradient=0.5),
           {"name": "nag", "momentum": 0.8,
            "common": common(learning_rate=0.1, wd=0.02, rescale_grad=0.7, clip_gradient=0.5)},
           {0: weights(N)}, [(0, g) for g in grads(N, 4)])

dense_case("nag_momentum_noclip",
           lambda: mx.optimizer.NAG(learning_rate=0.05, momentum=0.9, wd=0.01, rescale_grad=1.5),
           {"name": "nag", "momentum": 0.9,
            "common": common(learning_rate=0.05, wd=0.01, rescale_grad=1.5)},
           {0: weights(N)}, [(0, g) for g in grads(N, 4)])

dense_case("nag_no_momentum",
           lambda: mx.optimizer.NAG(learning_rate=0.1, momentum=0.0, wd=0.03, rescale_grad=0.5,
                                    clip_gradient=0.6),
           {"name": "nag", "momentum": 0.0,
            "common": common(learning_rate=0.1, wd=0.03, rescale_grad=0.5, clip_gradient=0.6)},
           {0: weights(N)}, [(0, g) for g in grads(N, 3)])

dense_case("signum_momentum_clip_wd_lh",
           lambda: mx.optimizer.Signum(learning_rate=0.01, momentum=0.9, wd=0.01, wd_lh=0.05,
                                       rescale_grad=0.5, clip_gradient=0.7),
           {"name": "signum", "momentum": 0.9, "wd_lh": 0.05,
            "common": common(learning_rate=0.01, wd=0.01, rescale_grad=0.5, clip_gradient=0.7)},
           {0: weights(N)}, [(0, g) for g in grads(N, 4)])

dense_case("signum_momentum_noclip",
           lambda: mx.optimizer.Signum(learning_rate=0.02, momentum=0.7, wd=0.1,
                                       rescale_grad=2.0),
           {"name": "signum", "momentum": 0.7,
            "common": common(learning_rate=0.02, wd=0.1, rescale_grad=2.0)},
           {0: weights(N)}, [(0, g) for g in grads(N, 4)])

dense_case("signsgd_no_momentum",
           lambda: mx.optimizer.Signum(learning_rate=0.03, momentum=0.0, wd=0.2),
           {"name": "signum", "momentum": 0.0,
            "common": common(learning_rate=0.03, wd=0.2)},
           {0: weights(N)}, [(0, g) for g in grads(N, 3)])


def _adam1():
    sch = mx.lr_scheduler.CosineScheduler(max_update=6, base_lr=0.01, final_lr=0.001,
                                          warmup_steps=2, warmup_begin_lr=0.002)
    o = mx.optimizer.Adam(learning_rate=0.01, beta1=0.8, beta2=0.95, epsilon=1e-6, wd=0.01,
                          rescale_grad=0.5, clip_gradient=0.6, lr_scheduler=sch)
    o.set_lr_mult({1: 2.0})
    return o


dense_case("adam_clip_wd_cosine_warmup", _adam1,
           {"name": "adam", "beta1": 0.8, "beta2": 0.95, "epsilon": 1e-6,
            "common": common(learning_rate=0.01, wd=0.01, rescale_grad=0.5, clip_gradient=0.6,
                             lr_mult={"1": 2.0},
                             lr_scheduler={"schedule": {"type": "cosine", "max_update": 6,
                                                        "final_lr": 0.001},
                                           "warmup": {"steps": 2, "begin_lr": 0.002,
                                                      "mode": "linear"}})},
           {0: weights(N), 1: weights(N)}, interleave([0, 1], 4, N))

dense_case("adam_noclip_begin_num_update",
           lambda: mx.optimizer.Adam(learning_rate=0.003, wd=0.02, rescale_grad=1.5,
                                     begin_num_update=5),
           {"name": "adam",
            "common": common(learning_rate=0.003, wd=0.02, rescale_grad=1.5, begin_num_update=5)},
           {0: weights(N)}, [(0, g) for g in grads(N, 5)])

dense_case("lamb_clip_bias_correction",
           lambda: mx.optimizer.LAMB(learning_rate=0.01, beta1=0.85, beta2=0.99, epsilon=1e-6,
                                     wd=0.01, rescale_grad=0.5, clip_gradient=0.9),
           {"name": "lamb", "beta1": 0.85, "beta2": 0.99, "epsilon": 1e-6,
            "common": common(learning_rate=0.01, wd=0.01, rescale_grad=0.5, clip_gradient=0.9)},
           {0: weights(N)}, [(0, g) for g in grads(N, 4)])

dense_case("lamb_bounds_no_bias_correction",
           lambda: mx.optimizer.LAMB(learning_rate=0.02, wd=0.1, bias_correction=False,
                                     lower_bound=0.5, upper_bound=1.5, rescale_grad=2.0),
           {"name": "lamb", "bias_correction": False, "lower_bound": 0.5, "upper_bound": 1.5,
            "common": common(learning_rate=0.02, wd=0.1, rescale_grad=2.0)},
           {0: weights(N, 3.0)}, [(0, g) for g in grads(N, 4)])

dense_case("adagrad_clip_wd_poly",
           lambda: mx.optimizer.AdaGrad(learning_rate=0.1, eps=1e-7, wd=0.01, rescale_grad=0.5,
                                        clip_gradient=0.8,
                                        lr_scheduler=mx.lr_scheduler.PolyScheduler(
                                            max_update=4, base_lr=0.1, pwr=2, final_lr=0.01)),
           {"name": "adagrad", "epsilon": 1e-7,
            "common": common(learning_rate=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=0.8,
                             lr_scheduler={"schedule": {"type": "poly", "max_update": 4,
                                                        "pwr": 2.0, "final_lr": 0.01}})},
           {0: weights(N)}, [(0, g) for g in grads(N, 5)])

dense_case("rmsprop_clip_wd_clip_weights",
           lambda: mx.optimizer.RMSProp(learning_rate=0.01, gamma1=0.8, epsilon=1e-6, wd=0.01,
                                        rescale_grad=0.5, clip_gradient=0.6, clip_weights=0.9),
           {"name": "rmsprop", "gamma1": 0.8, "epsilon": 1e-6, "clip_weights": 0.9,
            "common": common(learning_rate=0.01, wd=0.01, rescale_grad=0.5, clip_gradient=0.6)},
           {0: weights(N)}, [(0, g) for g in grads(N, 4)])

dense_case("rmsprop_centered",
           lambda: mx.optimizer.RMSProp(learning_rate=0.005, gamma1=0.9, gamma2=0.8,
                                        epsilon=1e-5, centered=True, wd=0.02, rescale_grad=0.7,
                                        clip_gradient=0.9),
           {"name": "rmsprop", "gamma1": 0.9, "gamma2": 0.8, "epsilon": 1e-5, "centered": True,
            "common": common(learning_rate=0.005, wd=0.02, rescale_grad=0.7, clip_gradient=0.9)},
           {0: weights(N)}, [(0, g) for g in grads(N, 4)])

dense_case("adadelta_clip_wd",
           lambda: mx.optimizer.AdaDelta(rho=0.9, epsilon=1e-5, wd=0.01, rescale_grad=0.5,
                                         clip_gradient=0.7),
           {"name": "adadelta", "rho": 0.9, "epsilon": 1e-5,
            "common": common(wd=0.01, rescale_grad=0.5, clip_gradient=0.7)},
           {0: weights(N)}, [(0, g) for g in grads(N, 4)])

dense_case("ftrl_clip_wd",
           lambda: mx.optimizer.Ftrl(lamda1=0.01, learning_rate=0.1, beta=1.0, wd=0.01,
                                     rescale_grad=0.5, clip_gradient=0.8),
           {"name": "ftrl", "lamda1": 0.01, "beta": 1.0,
            "common": common(learning_rate=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=0.8)},
           {0: weights(N)}, [(0, g) for g in grads(N, 4)])

dense_case("ftrl_noclip",
           lambda: mx.optimizer.Ftrl(lamda1=0.2, learning_rate=0.3, beta=0.5, wd=0.1,
                                     rescale_grad=1.5),
           {"name": "ftrl", "lamda1": 0.2, "beta": 0.5,
            "common": common(learning_rate=0.3, wd=0.1, rescale_grad=1.5)},
           {0: weights(N)}, [(0, g) for g in grads(N, 4)])

dense_case("test_optimizer",
           lambda: mx.optimizer.Test(rescale_grad=2.0),
           {"name": "test", "common": common(rescale_grad=2.0)},
           {0: weights(N)}, [(0, g) for g in grads(N, 3)])


# AdamW: MXNet 2.0 AdamW semantics on the 1.9.1 operator contrib.adamw_update.
def adamw_case(name, lr, beta1, beta2, eps, wd, rescale, clip, correct_bias, steps, init):
    w = mx.nd.array(init, dtype="float32")
    mean = mx.nd.zeros(w.shape)
    var = mx.nd.zeros(w.shape)
    rec = []
    for t, g in enumerate(steps, start=1):
        lr_t = lr
        if correct_bias:
            coef1 = 1. - beta1 ** t
            coef2 = 1. - beta2 ** t
            lr_t = lr * math.sqrt(coef2) / coef1
        kw = dict(lr=1.0, eta=lr_t, wd=wd, beta1=beta1, beta2=beta2, epsilon=eps)
        if clip:
            kw["clip_gradient"] = clip
        mx.nd.contrib.adamw_update(w, mx.nd.array(g, dtype="float32"), mean, var,
                                   mx.nd.array([rescale]), out=w, **kw)
        rec.append(("0", g, w.asnumpy().copy()))
    cfg = {"name": "adamw", "beta1": beta1, "beta2": beta2, "epsilon": eps,
           "correct_bias": correct_bias,
           "common": common(learning_rate=lr, wd=wd, rescale_grad=rescale)}
    if clip:
        cfg["common"]["clip_gradient"] = clip
    DENSE.append((name, json.dumps(cfg), [("0", init)], rec))


adamw_case("adamw_clip_wd", 0.01, 0.9, 0.99, 1e-6, 0.1, 0.5, 1.0, True, grads(N, 4), weights(N))
adamw_case("adamw_noclip_no_bias_correction", 0.005, 0.8, 0.999, 1e-8, 0.02, 1.5, None, False,
           grads(N, 4), weights(N))

# --------------------------------------------------------------------------------------
# Row-sparse gradients on a 5x3 weight
# --------------------------------------------------------------------------------------

SPARSE = []
ROWS, ROW_LEN = 5, 3
SPARSE_ROWS = [[0, 2], [1, 2, 4], [3], [0, 4]]


def sparse_case(name, make_opt, cfg, weight_stype="default", dense_grad=False):
    init = weights(ROWS * ROW_LEN).reshape(ROWS, ROW_LEN)
    opt = make_opt()
    up = mx.optimizer.get_updater(opt)
    w = mx.nd.array(init, dtype="float32")
    if weight_stype == "row_sparse":
        w = w.tostype("row_sparse")
    rec = []
    for rows in SPARSE_ROWS:
        data = (RNG.uniform(-1.0, 1.0, size=(len(rows), ROW_LEN)) * 1.5).astype(np.float32)
        data[0, 0] = np.float32(2.5)
        if dense_grad:
            dense = np.zeros((ROWS, ROW_LEN), dtype=np.float32)
            dense[rows] = data
            g = mx.nd.array(dense, dtype="float32")
        else:
            g = mx.nd.sparse.row_sparse_array((data, rows), shape=(ROWS, ROW_LEN))
        up(0, g, w)
        rec.append((rows, data, w.asnumpy().copy()))
    SPARSE.append((name, json.dumps(cfg), init, rec))


for lazy in (True, False):
    tag = "lazy" if lazy else "std"
    sparse_case("sgd_momentum_clip_" + tag,
                lambda: mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.05,
                                         rescale_grad=0.5, clip_gradient=0.8, lazy_update=lazy),
                {"name": "sgd", "momentum": 0.9, "lazy_update": lazy,
                 "common": common(learning_rate=0.1, wd=0.05, rescale_grad=0.5,
                                  clip_gradient=0.8)})
    sparse_case("sgd_momentum_noclip_" + tag,
                lambda: mx.optimizer.SGD(learning_rate=0.1, momentum=0.6, wd=0.02,
                                         rescale_grad=1.5, lazy_update=lazy),
                {"name": "sgd", "momentum": 0.6, "lazy_update": lazy,
                 "common": common(learning_rate=0.1, wd=0.02, rescale_grad=1.5)})
    sparse_case("sgd_plain_clip_" + tag,
                lambda: mx.optimizer.SGD(learning_rate=0.2, wd=0.1, rescale_grad=0.5,
                                         clip_gradient=0.6, lazy_update=lazy),
                {"name": "sgd", "momentum": 0.0, "lazy_update": lazy,
                 "common": common(learning_rate=0.2, wd=0.1, rescale_grad=0.5,
                                  clip_gradient=0.6)})
    sparse_case("sgd_plain_noclip_" + tag,
                lambda: mx.optimizer.SGD(learning_rate=0.2, wd=0.1, rescale_grad=0.5,
                                         lazy_update=lazy),
                {"name": "sgd", "momentum": 0.0, "lazy_update": lazy,
                 "common": common(learning_rate=0.2, wd=0.1, rescale_grad=0.5)})
    sparse_case("adam_clip_" + tag,
                lambda: mx.optimizer.Adam(learning_rate=0.01, beta1=0.8, beta2=0.9, wd=0.05,
                                          rescale_grad=0.5, clip_gradient=0.7, lazy_update=lazy),
                {"name": "adam", "beta1": 0.8, "beta2": 0.9, "lazy_update": lazy,
                 "common": common(learning_rate=0.01, wd=0.05, rescale_grad=0.5,
                                  clip_gradient=0.7)})
    sparse_case("adam_noclip_" + tag,
                lambda: mx.optimizer.Adam(learning_rate=0.02, wd=0.01, rescale_grad=1.5,
                                          lazy_update=lazy),
                {"name": "adam", "lazy_update": lazy,
                 "common": common(learning_rate=0.02, wd=0.01, rescale_grad=1.5)})

# AdaGrad: MXNet's row_sparse kernel is always lazy (and requires wd == 0); the standard
# mode is the dense update of the densified gradient.
sparse_case("adagrad_clip_lazy",
            lambda: mx.optimizer.AdaGrad(learning_rate=0.1, eps=1e-6, rescale_grad=0.5,
                                         clip_gradient=0.8),
            {"name": "adagrad", "epsilon": 1e-6, "lazy_update": True,
             "common": common(learning_rate=0.1, rescale_grad=0.5, clip_gradient=0.8)})
sparse_case("adagrad_clip_wd_std",
            lambda: mx.optimizer.AdaGrad(learning_rate=0.1, eps=1e-6, wd=0.05, rescale_grad=0.5,
                                         clip_gradient=0.8),
            {"name": "adagrad", "epsilon": 1e-6, "lazy_update": False,
             "common": common(learning_rate=0.1, wd=0.05, rescale_grad=0.5, clip_gradient=0.8)},
            dense_grad=True)
# FTRL: lazy needs a row_sparse weight in MXNet; a dense weight falls back to the dense
# kernel (= standard mode).
sparse_case("ftrl_clip_lazy",
            lambda: mx.optimizer.Ftrl(lamda1=0.01, learning_rate=0.1, beta=1.0, wd=0.01,
                                      rescale_grad=0.5, clip_gradient=0.8),
            {"name": "ftrl", "lamda1": 0.01, "beta": 1.0, "lazy_update": True,
             "common": common(learning_rate=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=0.8)},
            weight_stype="row_sparse")
sparse_case("ftrl_clip_std",
            lambda: mx.optimizer.Ftrl(lamda1=0.01, learning_rate=0.1, beta=1.0, wd=0.01,
                                      rescale_grad=0.5, clip_gradient=0.8),
            {"name": "ftrl", "lamda1": 0.01, "beta": 1.0, "lazy_update": False,
             "common": common(learning_rate=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=0.8)})

# --------------------------------------------------------------------------------------
# float16 weights with multi_precision=True
# --------------------------------------------------------------------------------------

HALF = []


def half_case(name, make_opt, cfg, nsteps):
    init = weights(N).astype(np.float16)
    opt = make_opt()
    up = mx.optimizer.get_updater(opt)
    w = mx.nd.array(init, dtype="float16")
    rec = []
    for g in grads(N, nsteps):
        g16 = g.astype(np.float16)
        up(0, mx.nd.array(g16, dtype="float16"), w)
        st = up.states[0]
        # SGD keeps (mom, weight32); the generic path keeps (weight32, inner state)
        master = st[1] if isinstance(opt, mx.optimizer.SGD) else st[0]
        rec.append((g16.view(np.uint16), w.asnumpy().view(np.uint16).copy(),
                    master.asnumpy().copy()))
    HALF.append((name, json.dumps(cfg), init.view(np.uint16), rec))


half_case("sgd_momentum_multi_precision_f16",
          lambda: mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5,
                                   clip_gradient=0.8, multi_precision=True),
          {"name": "sgd", "momentum": 0.9,
           "common": common(learning_rate=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=0.8,
                            multi_precision=True)}, 4)
half_case("adam_multi_precision_f16",
          lambda: mx.optimizer.Adam(learning_rate=0.01, wd=0.01, rescale_grad=0.5,
                                    clip_gradient=0.8, multi_precision=True),
          {"name": "adam",
           "common": common(learning_rate=0.01, wd=0.01, rescale_grad=0.5, clip_gradient=0.8,
                            multi_precision=True)}, 4)

# --------------------------------------------------------------------------------------
# LR schedulers
# --------------------------------------------------------------------------------------

SCHED = []


def sched_case(name, make, cfg, base_lr, points):
    s = make()
    SCHED.append((name, json.dumps(cfg), base_lr, [(n, s(n)) for n in points]))


PTS = list(range(0, 16))
sched_case("factor_linear_warmup",
           lambda: mx.lr_scheduler.FactorScheduler(step=3, factor=0.5, stop_factor_lr=1e-3,
                                                   base_lr=0.1, warmup_steps=2,
                                                   warmup_begin_lr=0.01),
           {"schedule": {"type": "factor", "step": 3, "factor": 0.5, "stop_factor_lr": 1e-3},
            "warmup": {"steps": 2, "begin_lr": 0.01, "mode": "linear"}}, 0.1, PTS)
sched_case("factor_stop_floor",
           lambda: mx.lr_scheduler.FactorScheduler(step=1, factor=0.1, stop_factor_lr=1e-4,
                                                   base_lr=0.5),
           {"schedule": {"type": "factor", "step": 1, "factor": 0.1, "stop_factor_lr": 1e-4}},
           0.5, PTS)
sched_case("multi_factor_constant_warmup",
           lambda: mx.lr_scheduler.MultiFactorScheduler(step=[4, 6, 9], factor=0.1, base_lr=1.0,
                                                        warmup_steps=3, warmup_begin_lr=0.25,
                                                        warmup_mode="constant"),
           {"schedule": {"type": "multi_factor", "steps": [4, 6, 9], "factor": 0.1},
            "warmup": {"steps": 3, "begin_lr": 0.25, "mode": "constant"}}, 1.0, PTS)
sched_case("poly_warmup",
           lambda: mx.lr_scheduler.PolyScheduler(max_update=12, base_lr=0.1, pwr=2,
                                                 final_lr=0.001, warmup_steps=2,
                                                 warmup_begin_lr=0.02),
           {"schedule": {"type": "poly", "max_update": 12, "pwr": 2.0, "final_lr": 0.001},
            "warmup": {"steps": 2, "begin_lr": 0.02, "mode": "linear"}}, 0.1, PTS)
sched_case("poly_pwr3",
           lambda: mx.lr_scheduler.PolyScheduler(max_update=10, base_lr=0.3, pwr=3),
           {"schedule": {"type": "poly", "max_update": 10, "pwr": 3.0, "final_lr": 0.0}},
           0.3, PTS)
sched_case("cosine_warmup",
           lambda: mx.lr_scheduler.CosineScheduler(max_update=10, base_lr=0.1, final_lr=0.01,
                                                   warmup_steps=3, warmup_begin_lr=0.001),
           {"schedule": {"type": "cosine", "max_update": 10, "final_lr": 0.01},
            "warmup": {"steps": 3, "begin_lr": 0.001, "mode": "linear"}}, 0.1, PTS)
sched_case("cosine_plain",
           lambda: mx.lr_scheduler.CosineScheduler(max_update=7, base_lr=2.0),
           {"schedule": {"type": "cosine", "max_update": 7, "final_lr": 0.0}}, 2.0, PTS)

# --------------------------------------------------------------------------------------
# Rust output
# --------------------------------------------------------------------------------------

emit("//! Expected optimizer values from MXNet 1.9.1 (generated; do not edit by hand).")
emit("//!")
emit("//! Regenerate with `crates/synkv/tests/oracle/gen_optimizer_cases.py` (see its header).")
emit("//! Each case carries the synkv optimizer JSON that must reproduce MXNet's numbers.")
emit("")
emit("#![allow(clippy::excessive_precision, clippy::unreadable_literal)]")
emit("")
emit("/// One update of a dense case: the key, the gradient and the weight after the update.")
emit("pub(super) struct Step {")
emit("    pub key: &'static str,")
emit("    pub grad: &'static [f32],")
emit("    pub expected: &'static [f32],")
emit("}")
emit("")
emit("/// Several updates through `mx.optimizer.get_updater` on float32 weights.")
emit("pub(super) struct DenseCase {")
emit("    pub name: &'static str,")
emit("    pub optimizer: &'static str,")
emit("    pub init: &'static [(&'static str, &'static [f32])],")
emit("    pub steps: &'static [Step],")
emit("}")
emit("")
emit("/// One row_sparse update: gradient rows, their data and the dense weight afterwards.")
emit("pub(super) struct SparseStep {")
emit("    pub rows: &'static [i64],")
emit("    pub data: &'static [f32],")
emit("    pub expected: &'static [f32],")
emit("}")
emit("")
emit("/// Row_sparse gradients on a dense weight of `ROWS` x `ROW_LEN`.")
emit("pub(super) struct SparseCase {")
emit("    pub name: &'static str,")
emit("    pub optimizer: &'static str,")
emit("    pub init: &'static [f32],")
emit("    pub steps: &'static [SparseStep],")
emit("}")
emit("")
emit("/// One float16 update: gradient bits, weight bits and float32 master copy afterwards.")
emit("pub(super) struct HalfStep {")
emit("    pub grad: &'static [u16],")
emit("    pub expected: &'static [u16],")
emit("    pub master: &'static [f32],")
emit("}")
emit("")
emit("/// float16 weights with `multi_precision = true`.")
emit("pub(super) struct HalfCase {")
emit("    pub name: &'static str,")
emit("    pub optimizer: &'static str,")
emit("    pub init: &'static [u16],")
emit("    pub steps: &'static [HalfStep],")
emit("}")
emit("")
emit("/// `mx.lr_scheduler` values at consecutive `num_update` points.")
emit("pub(super) struct SchedCase {")
emit("    pub name: &'static str,")
emit("    pub scheduler: &'static str,")
emit("    pub base_lr: f64,")
emit("    pub points: &'static [(u64, f64)],")
emit("}")
emit("")
emit("pub(super) const ROWS: usize = %d;" % ROWS)
emit("pub(super) const ROW_LEN: usize = %d;" % ROW_LEN)
emit("")
emit("pub(super) const DENSE_CASES: &[DenseCase] = &[")
for name, cfg, init, rec in DENSE:
    emit("    DenseCase {")
    emit("        name: %s," % json.dumps(name))
    emit("        optimizer: %s," % rstr(cfg))
    emit("        init: &[%s]," % ", ".join("(%s, %s)" % (json.dumps(k), arr32(v)) for k, v in init))
    emit("        steps: &[")
    for k, g, w in rec:
        emit("            Step { key: %s, grad: %s, expected: %s }," % (json.dumps(k), arr32(g), arr32(w)))
    emit("        ],")
    emit("    },")
emit("];")
emit("")
emit("pub(super) const SPARSE_CASES: &[SparseCase] = &[")
for name, cfg, init, rec in SPARSE:
    emit("    SparseCase {")
    emit("        name: %s," % json.dumps(name))
    emit("        optimizer: %s," % rstr(cfg))
    emit("        init: %s," % arr32(init))
    emit("        steps: &[")
    for rows, data, w in rec:
        emit("            SparseStep { rows: %s, data: %s, expected: %s }," % (arr_i64(rows), arr32(data), arr32(w)))
    emit("        ],")
    emit("    },")
emit("];")
emit("")
emit("pub(super) const HALF_CASES: &[HalfCase] = &[")
for name, cfg, init, rec in HALF:
    emit("    HalfCase {")
    emit("        name: %s," % json.dumps(name))
    emit("        optimizer: %s," % rstr(cfg))
    emit("        init: %s," % arr_u16(init))
    emit("        steps: &[")
    for g, w, m in rec:
        emit("            HalfStep { grad: %s, expected: %s, master: %s }," % (arr_u16(g), arr_u16(w), arr32(m)))
    emit("        ],")
    emit("    },")
emit("];")
emit("")
emit("pub(super) const SCHED_CASES: &[SchedCase] = &[")
for name, cfg, base, pts in SCHED:
    emit("    SchedCase {")
    emit("        name: %s," % json.dumps(name))
    emit("        scheduler: %s," % rstr(cfg))
    emit("        base_lr: %s," % f64(base))
    emit("        points: &[%s]," % ", ".join("(%d, %s)" % (n, f64(v)) for n, v in pts))
    emit("    },")
emit("];")

sys.stdout.write("\n".join(OUT) + "\n")

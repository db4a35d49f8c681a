"""set_optimizer with synkv.optimizer / synkv.lr_scheduler, and optimizer states. The
expected weights were recorded from MXNet 1.9.1 (`mx.kv.create('local')`, same calls)."""

import json

import numpy as np
import pytest

import synkv
from synkv import lr_scheduler, optimizer

W0 = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
GRADS = [
    np.array([0.5, -1.5, 2.0, 0.1], np.float32),
    np.array([-0.3, 0.2, 4.0, -2.5], np.float32),
    np.array([1.0, 1.0, -1.0, 0.0], np.float32),
]

# fmt: off
MXNET_1_9_1 = {
    "sgd_mom": [[0.9739999771118164, -1.9229999780654907, 2.8970000743865967, 0.4945000112056732], [0.9646259546279907, -1.8617769479751587, 2.601402997970581, 0.6140555143356323], [0.9052247405052185, -1.8548145294189453, 2.3827643394470215, 0.7210414409637451]],
    "adam": [[0.9899999499320984, -1.9899998903274536, 2.990000009536743, 0.4899999499320984], [0.9880619645118713, -1.9848730564117432, 2.9800000190734863, 0.4967344105243683], [0.9817885756492615, -1.9865137338638306, 2.9773664474487305, 0.5019369721412659]],
    "adagrad": [[0.9000002145767212, -1.899999976158142, 2.9000000953674316, 0.4000050127506256], [0.9514496922492981, -1.9132163524627686, 2.8105573654174805, 0.4999251067638397], [0.8650628924369812, -1.9683481454849243, 2.832379102706909, 0.4999251067638397]],
    "rmsprop_c": [[0.9541168808937073, -1.9541168212890625, 2.9541168212890625, 0.4541173279285431], [0.9363210201263428, -1.9189904928207397, 2.870727777481079, 0.4585798680782318], [0.8801941871643066, -1.9129118919372559, 2.8060057163238525, 0.4625961482524872]],
    "factor": [[0.0, -3.0, 2.0, -0.5], [-1.0, -4.0, 1.0, -1.5], [-1.5, -4.5, 0.5, -2.0], [-2.0, -5.0, 0.0, -2.5]],
    "test": [[2.0, -5.0, 7.0, 0.699999988079071], [1.399999976158142, -4.599999904632568, 15.0, -4.300000190734863]],
}
# fmt: on

CASES = {
    "sgd_mom": (lambda: optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5), GRADS),
    "adam": (lambda: optimizer.Adam(learning_rate=0.01, clip_gradient=1.0, wd=0.001), GRADS),
    "adagrad": (lambda: optimizer.AdaGrad(learning_rate=0.1, eps=1e-6), GRADS),
    "rmsprop_c": (lambda: optimizer.RMSProp(learning_rate=0.01, centered=True, gamma1=0.95, gamma2=0.9), GRADS),
    "factor": (
        lambda: optimizer.SGD(learning_rate=1.0, lr_scheduler=lr_scheduler.FactorScheduler(step=2, factor=0.5)),
        [np.ones(4, np.float32)] * 4,
    ),
    "test": (lambda: optimizer.create("Test", rescale_grad=2.0), GRADS[:2]),
}


def run(opt, grads, kv=None):
    kv = kv or synkv.create("local")
    kv.set_optimizer(opt)
    kv.init(3, W0)
    out, seen = np.zeros(4, np.float32), []
    for g in grads:
        kv.push(3, g)
        kv.pull(3, out=out)
        seen.append(out.copy())
    return seen


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_mxnet(case):
    make, grads = CASES[case]
    got = run(make(), grads)
    np.testing.assert_allclose(np.array(got), np.array(MXNET_1_9_1[case], np.float32), rtol=1e-6, atol=1e-7)


def test_descriptions():
    assert synkv.create("local").is_capable("optimizer")
    cfg = optimizer.SGD().to_config()
    assert cfg["name"] == "sgd" and cfg["momentum"] == 0.0 and cfg["lazy_update"] is True
    assert cfg["common"]["learning_rate"] is None  # the optimizer's default (0.01 for SGD)
    assert optimizer.Adam().learning_rate == 0.001
    sched = lr_scheduler.PolyScheduler(max_update=100, base_lr=0.5, warmup_steps=10)
    assert optimizer.SGD(lr_scheduler=sched).learning_rate == 0.5  # no lr given: the scheduler's
    assert optimizer.AdaGrad(eps=1e-3).to_config()["epsilon"] == 1e-3  # MXNet's `eps`
    assert optimizer.SGD(clip_gradient=-1).to_config()["common"]["clip_gradient"] is None
    opt = optimizer.SGD()
    opt.set_lr_mult({3: 2.0, "w": 0.5})
    assert opt.to_config()["common"]["lr_mult"] == {"3": 2.0, "w": 0.5}
    for name in ["sgd", "nag", "signum", "adam", "adamw", "lamb", "adagrad", "rmsprop", "adadelta", "ftrl", "test"]:
        kv = synkv.create("local")
        kv.set_optimizer(optimizer.create(name, learning_rate=0.01, wd=0.1, lr_scheduler=sched))
        kv.init(0, np.ones(8, np.float32))
        kv.push(0, np.full(8, 0.5, np.float32))
        out = np.zeros(8, np.float32)
        kv.pull(0, out=out)
        assert np.isfinite(out).all(), name
    kv = synkv.create("local")
    kv.set_optimizer(json.dumps({"name": "test", "common": {"rescale_grad": 3.0}}))  # JSON works too
    kv.init(1, np.zeros(2, np.float32))
    kv.push(1, np.ones(2, np.float32))
    out = np.zeros(2, np.float32)
    kv.pull(1, out=out)
    np.testing.assert_array_equal(out, [3, 3])


def test_lr_mult_by_key():
    kv = synkv.create("local")
    opt = optimizer.SGD(learning_rate=1.0)
    opt.set_lr_mult({"a": 0.5})
    kv.set_optimizer(opt)
    kv.init(["a", "b"], [np.zeros(2, np.float32), np.zeros(2, np.float32)])
    kv.push(["a", "b"], [np.ones(2, np.float32), np.ones(2, np.float32)])
    outs = [np.zeros(2, np.float32), np.zeros(2, np.float32)]
    kv.pull(["a", "b"], out=outs)
    np.testing.assert_array_equal(outs[0], [-0.5, -0.5])
    np.testing.assert_array_equal(outs[1], [-1, -1])


def test_save_and_load_states(tmp_path):
    make, grads = CASES["sgd_mom"]
    straight = run(make(), grads)
    kv = synkv.create("local")
    run(make(), grads[:2], kv)
    path = tmp_path / "states.bin"
    kv.save_optimizer_states(str(path), dump_optimizer=True)
    resumed = synkv.create("local")
    resumed.set_optimizer(make())
    resumed.init(3, straight[1])
    resumed.load_optimizer_states(path)  # os.PathLike works too
    resumed.push(3, grads[2])
    out = np.zeros(4, np.float32)
    resumed.pull(3, out=out)
    np.testing.assert_allclose(out, straight[2], rtol=1e-6)


def test_optimizer_errors(tmp_path):
    kv = synkv.create("local")
    with pytest.raises(synkv.KVStoreError, match="momentum"):
        kv.set_optimizer(optimizer.SGD(momentum=1.5))
    with pytest.raises(synkv.KVStoreError, match="invalid optimizer description"):
        kv.set_optimizer('{"name": "sgd", "momentun": 0.9}')
    with pytest.raises(TypeError, match="set_optimizer takes"):
        kv.set_optimizer(42)
    with pytest.raises(ValueError, match="unknown optimizer"):
        optimizer.create("nope")
    with pytest.raises(synkv.KVStoreUnsupportedError, match="no optimizer is installed"):
        kv.save_optimizer_states(str(tmp_path / "x"))
    kv.set_optimizer(optimizer.SGD(momentum=0.9))
    kv.init(3, W0)
    kv.push(3, GRADS[0])
    kv.save_optimizer_states(str(tmp_path / "sgd"))
    other = synkv.create("local")
    other.set_optimizer(optimizer.Adam())
    with pytest.raises(synkv.KVStoreError, match="written by optimizer `sgd`"):
        other.load_optimizer_states(str(tmp_path / "sgd"))
    (tmp_path / "junk").write_bytes(b"not a state file")
    with pytest.raises(synkv.KVStoreError, match="corrupted"):
        kv.load_optimizer_states(str(tmp_path / "junk"))
    with pytest.raises(synkv.KVStoreError, match="cannot read"):
        kv.load_optimizer_states(str(tmp_path / "missing"))

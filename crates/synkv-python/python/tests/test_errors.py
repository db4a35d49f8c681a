"""Exceptions: the class for each error kind, and updater failures that never crash."""

import warnings

import numpy as np
import pytest

import synkv
from conftest import SHAPE, assert_all, ones, zeros


def drain(kv):
    """Clears the process-wide engine error log (errors of asynchronous work are reported by
    the next `wait_all` of any store)."""
    try:
        kv.wait_all()
    except synkv.KVStoreError:
        pass


def test_exception_hierarchy():
    for sub in [synkv.KVStoreKeyError, synkv.KVStoreShapeError, synkv.KVStoreDTypeError, synkv.KVStoreUnsupportedError, synkv.UpdaterError]:
        assert issubclass(sub, synkv.KVStoreError)
    assert issubclass(synkv.KVStoreError, Exception)
    assert synkv.KVStoreError.__module__ == "synkv"


def test_error_kinds():
    kv = synkv.create("local")
    with pytest.raises(synkv.KVStoreKeyError, match="has not been initialised"):
        kv.pull(3, out=zeros())
    kv.init(3, zeros())
    with pytest.raises(synkv.KVStoreKeyError, match="duplicate init of key 3"):
        kv.init(3, zeros())
    with pytest.raises(synkv.KVStoreShapeError, match=r"the key holds \(4, 4\), got \(2, 2\)"):
        kv.push(3, np.zeros((2, 2), np.float32))
    with pytest.raises(synkv.KVStoreShapeError):
        kv.pull(3, out=np.zeros(16, np.float32))
    with pytest.raises(synkv.KVStoreDTypeError, match="dtype mismatch"):
        kv.push(3, np.zeros(SHAPE, np.float64))
    with pytest.raises(synkv.KVStoreError, match="3 keys but 2 values"):
        kv.push([3, 3, 3], [ones(), ones()])
    with pytest.raises(synkv.KVStoreError, match="unknown store type"):
        synkv.create("teststore")
    # a rejected call changes nothing
    out = ones()
    kv.pull(3, out=out)
    assert_all(out, 0)


def test_dist_store_outside_a_job(monkeypatch):
    for var in ["DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"]:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(synkv.KVStoreError, match="DMLC_PS_ROOT_URI"):
        synkv.create("dist_sync")


def test_updater_exception_is_raised_by_the_next_pull():
    kv = synkv.create("local")
    kv.init([3, 4], [ones(), ones()])

    def updater(key, recv, stored):
        if key == 3:
            raise ValueError("bad gradient")
        stored += recv

    kv.set_updater(updater)
    kv.push([3, 4], [ones(), ones()])  # returns normally: the update runs asynchronously
    out = zeros()
    with pytest.raises(synkv.UpdaterError, match="bad gradient") as info:
        kv.pull(3, out=out)
    assert isinstance(info.value.__cause__, ValueError)
    assert str(info.value.__cause__) == "bad gradient"
    kv.pull(4, out=out)  # the other key of the push was updated
    assert_all(out, 2)
    kv.pull(3, out=out)  # reported once; the key keeps its last good value
    assert_all(out, 1)
    with pytest.raises(synkv.UpdaterError):
        kv.wait_all()  # and once engine-wide
    kv.wait_all()


def test_updater_misuse_never_crashes():
    kv = synkv.create("local")
    kv.init("w", ones())

    def reenter(key, recv, stored):
        kv.pull("w", out=zeros())  # would wait on the update that is running

    kv.set_updater(reenter)
    kv.push("w", ones())
    with pytest.raises(synkv.UpdaterError) as info:
        kv.pull("w", out=zeros())
    assert isinstance(info.value.__cause__, synkv.KVStoreError)
    assert "inside an updater" in str(info.value.__cause__)
    drain(kv)

    def reshape(key, recv, stored):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # numpy >= 2.5
            stored.shape = (16,)  # reshapes only this view of the store's buffer: harmless

    kv.set_updater(reshape)
    before = zeros()
    kv.pull("w", out=before)
    kv.push("w", ones())
    after = zeros()
    kv.pull("w", out=after)
    np.testing.assert_array_equal(after, before)
    drain(kv)

    kv.set_updater(lambda: None)  # wrong arity: TypeError inside, reported as UpdaterError
    kv.push("w", ones())
    with pytest.raises(synkv.UpdaterError) as info:
        kv.pull("w", out=zeros())
    assert isinstance(info.value.__cause__, TypeError)
    drain(kv)

    with pytest.raises(TypeError, match="callable"):
        kv.set_updater(42)
    kv.set_updater(None)  # back to assign
    kv.push("w", ones() * 5)
    out = zeros()
    kv.pull("w", out=out)
    assert_all(out, 5)


def test_updater_arguments():
    kv = synkv.create("local")
    kv.init("w", np.full((2, 3), 2, np.float64))
    seen = {}

    def updater(key, recv, stored):
        seen.update(key=key, recv=recv.copy(), stored=stored.copy(), dtype=stored.dtype, shape=stored.shape)
        stored *= recv

    kv.set_updater(updater)
    kv.push("w", [np.full((2, 3), 1.5), np.full((2, 3), 1.5)])
    out = np.zeros((2, 3))
    kv.pull("w", out=out)
    assert seen["key"] == "w" and isinstance(seen["key"], str)
    assert seen["dtype"] == np.float64 and seen["shape"] == (2, 3)
    assert_all(seen["recv"], 3)
    assert_all(seen["stored"], 2)
    assert_all(out, 6)


def test_gradient_compression_on_device_and_refused_on_local():
    # K7.1 / K7.9: a device store quantizes even one device's push (2bit, t=0.5)
    kv = synkv.create("device")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.init(1, np.zeros(8, dtype=np.float32))
    kv.push(1, np.array([0.6, -0.7, 0.2, 0.5, -0.5, 0.0, 1.2, -0.49], dtype=np.float32))
    out = np.zeros(8, dtype=np.float32)
    kv.pull(1, out=out)
    assert out.tolist() == [0.5, -0.5, 0.0, 0.5, -0.5, 0.0, 0.5, 0.0]
    with pytest.raises(synkv.KVStoreError, match="not supported for this type of kvstore"):
        synkv.create("local").set_gradient_compression({"type": "2bit"})
    with pytest.raises(synkv.KVStoreError, match="threshold must be greater than 0"):
        synkv.create("device").set_gradient_compression({"type": "2bit", "threshold": 0})

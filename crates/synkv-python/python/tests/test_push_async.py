"""Issue 6 (Python part): ``push`` returns once its values are consumed, before the update
runs; the non-blocking form (``block=False`` returning a ``synkv.Request``); updaters that get
NumPy views of the store's buffers instead of copies.

Every wait is bounded: a test that would otherwise wait forever fails after a timeout.
"""

import gc
import os
import threading
import time

import numpy as np
import pytest

import synkv
from conftest import SHAPE

TIMEOUT = 10.0


def engine_threads():
    """The global engine's thread count (SYNKV_ENGINE_THREADS, else the usable CPUs)."""
    env = os.environ.get("SYNKV_ENGINE_THREADS", "")
    if env.strip().isdigit() and int(env) > 0:
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Gate:
    """An updater ``stored += 3 * input`` that blocks until the test opens the gate (bounded:
    a timeout is recorded, so a push that waits for the update fails the test)."""

    def __init__(self):
        self.started = threading.Event()
        self.go = threading.Event()
        self.timed_out = False
        self.keys = []

    def __call__(self, key, inp, stored):
        self.keys.append(key)
        self.started.set()
        if not self.go.wait(TIMEOUT):
            self.timed_out = True
        stored += inp * 3


# ---- push returns once its values are consumed ----


def test_push_returns_before_the_update_and_the_values_can_be_overwritten(store_type):
    kv = synkv.create(store_type)
    kv.init(3, np.zeros(SHAPE, np.float32))
    gate = Gate()
    kv.set_updater(gate)
    value = np.full(SHAPE, 2.0, np.float32)
    kv.push(3, value)
    # push returned while the updater is (about to be) blocked on the gate
    assert not gate.timed_out, "push waited for the update to run"
    value[:] = 100.0  # reuse the buffer at once
    gate.go.set()
    out = np.zeros(SHAPE, np.float32)
    kv.pull(3, out=out)
    assert gate.started.is_set() and not gate.timed_out
    np.testing.assert_array_equal(out, np.full(SHAPE, 6.0))


def test_push_of_many_keys_returns_while_the_first_update_is_blocked():
    kv = synkv.create("local")
    keys = [5, 7, 11]
    kv.init(keys, [np.zeros(SHAPE, np.float32) for _ in keys])
    gate = Gate()
    kv.set_updater(gate)
    values = [np.full(SHAPE, float(i + 1), np.float32) for i in range(len(keys))]
    kv.push(keys, values)
    assert not gate.timed_out, "push waited for an update to run"
    for v in values:
        v[:] = -1.0
    gate.go.set()
    outs = [np.zeros(SHAPE, np.float32) for _ in keys]
    kv.pull(keys, out=outs)
    assert gate.keys == keys  # updates still run one at a time, in key order
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o, np.full(SHAPE, 3.0 * (i + 1)))


@pytest.mark.skipif(engine_threads() < 2, reason="one engine thread stays blocked in the updater")
def test_a_blocked_update_does_not_hold_up_the_push_of_another_key():
    kv = synkv.create("local")
    kv.init([1, 2], [np.zeros(SHAPE, np.float32), np.zeros(SHAPE, np.float32)])
    gate = Gate()
    kv.set_updater(gate)
    kv.push(1, np.ones(SHAPE, np.float32))
    assert gate.started.wait(TIMEOUT)
    b = np.full(SHAPE, 2.0, np.float32)
    kv.push(2, b)  # key 1's update is still blocked
    assert not gate.timed_out, "the push of key 2 waited for key 1's update"
    b[:] = 0.0
    gate.go.set()
    outs = [np.zeros(SHAPE, np.float32), np.zeros(SHAPE, np.float32)]
    kv.pull([1, 2], out=outs)
    np.testing.assert_array_equal(outs[0], np.full(SHAPE, 3.0))
    np.testing.assert_array_equal(outs[1], np.full(SHAPE, 6.0))


def test_push_with_an_optimizer_may_overwrite_the_gradient_at_once(store_type):
    kv = synkv.create(store_type)
    kv.init(3, np.ones(SHAPE, np.float32))
    kv.set_optimizer(synkv.optimizer.SGD(learning_rate=0.5))
    grad = np.ones(SHAPE, np.float32)
    for _ in range(3):
        kv.push(3, grad)
        grad[:] = 1000.0  # the push has consumed it; the update uses the pushed ones
        grad[:] = 1.0
    out = np.zeros(SHAPE, np.float32)
    kv.pull(3, out=out)
    np.testing.assert_allclose(out, np.full(SHAPE, 1.0 - 3 * 0.5))


# ---- block=False ----


def wait_done(req):
    deadline = time.monotonic() + TIMEOUT
    while not req.done():
        assert time.monotonic() < deadline, "request never completed"
        time.sleep(0.001)


def test_non_blocking_push_pull_and_pushpull(store_type):
    kv = synkv.create(store_type)
    kv.init(3, np.zeros(SHAPE, np.float32))
    req = kv.push(3, np.full(SHAPE, 2.0, np.float32), block=False)  # the value lives in the request
    assert isinstance(req, synkv.Request)
    gc.collect()
    req.wait()
    assert req.done()
    req.wait()  # again: returns at once
    out = np.zeros(SHAPE, np.float32)
    req = kv.pull(3, out=out, block=False)
    wait_done(req)
    np.testing.assert_array_equal(out, np.full(SHAPE, 2.0))
    val, out2 = np.full(SHAPE, 5.0, np.float32), np.zeros(SHAPE, np.float32)
    kv.pushpull(3, val, out=out2, block=False).wait()
    np.testing.assert_array_equal(out2, np.full(SHAPE, 5.0))
    inplace = np.full(SHAPE, 7.0, np.float32)
    kv.pushpull(3, inplace, block=False).wait()
    np.testing.assert_array_equal(inplace, np.full(SHAPE, 7.0))
    assert "Request" in repr(req)
    # the blocking forms still return None
    assert kv.push(3, val) is None and kv.pull(3, out=out) is None


def test_non_blocking_row_sparse_output_is_written_back_on_completion():
    kv = synkv.create("local")
    dense = np.arange(16, dtype=np.float32).reshape(SHAPE)
    kv.init(9, synkv.row_sparse_array(dense))
    out = synkv.RowSparseNDArray.zeros(SHAPE)
    kv.pull(9, out=out, ignore_sparse=False, block=False).wait()
    np.testing.assert_array_equal(out.todense(), dense)


def test_non_blocking_broadcast_and_row_sparse_pull(store_type):
    kv = synkv.create(store_type)
    outs = [np.zeros(SHAPE, np.float32) for _ in range(2)]
    req = kv.broadcast(4, np.full(SHAPE, 3.0, np.float32), out=outs, block=False)
    assert isinstance(req, synkv.Request)
    req.wait()
    for o in outs:
        np.testing.assert_array_equal(o, np.full(SHAPE, 3.0))
    dense = np.arange(16, dtype=np.float32).reshape(SHAPE)
    kv.init(10, synkv.row_sparse_array(dense))
    out = synkv.RowSparseNDArray.zeros(SHAPE)
    req = kv.row_sparse_pull(10, out=out, row_ids=np.array([3, 1]), block=False)
    req.wait()
    expected = np.zeros(SHAPE, np.float32)
    expected[[1, 3]] = dense[[1, 3]]
    np.testing.assert_array_equal(out.todense(), expected)
    with pytest.raises(synkv.KVStoreError):
        kv.row_sparse_pull(10, out=out, row_ids=np.array([99]), block=False).wait()


def test_non_blocking_errors_are_raised_by_wait_every_time():
    kv = synkv.create("local")
    kv.init(3, np.zeros(SHAPE, np.float32))
    # invalid arguments are still refused by the call itself
    with pytest.raises(synkv.KVStoreShapeError):
        kv.push(3, np.zeros((2, 2), np.float32), block=False)

    def bad(key, inp, stored):
        raise ValueError("boom")

    kv.set_updater(bad)
    kv.push(3, np.ones(SHAPE, np.float32), block=False).wait()  # consumed fine
    req = kv.pull(3, out=np.zeros(SHAPE, np.float32), block=False)
    with pytest.raises(synkv.KVStoreError) as info:
        req.wait()
    assert isinstance(info.value, synkv.UpdaterError)
    assert req.done()
    with pytest.raises(synkv.UpdaterError):
        req.wait()
    with pytest.raises(synkv.KVStoreError):
        kv.wait_all()  # the engine-wide log has it too; clear it for the other tests
    kv.set_updater(None)


def test_many_outstanding_requests():
    kv = synkv.create("local")
    n = 200
    keys = list(range(100, 100 + n))
    kv.init(keys, [np.zeros(SHAPE, np.float32) for _ in keys])
    pushes = [kv.push(k, np.full(SHAPE, float(k), np.float32), block=False) for k in keys]
    outs = [np.zeros(SHAPE, np.float32) for _ in keys]
    pulls = [kv.pull(k, out=o, block=False) for k, o in zip(keys, outs)]
    del pushes  # dropping requests unfinished is fine
    gc.collect()
    for r in pulls:
        r.wait()
    for k, o in zip(keys, outs):
        np.testing.assert_array_equal(o, np.full(SHAPE, float(k)))
    kv.wait_all()


def test_wait_releases_the_gil():
    kv = synkv.create("local")
    kv.init(3, np.zeros(SHAPE, np.float32))
    gate = Gate()
    kv.set_updater(gate)
    kv.push(3, np.ones(SHAPE, np.float32))
    req = kv.pull(3, out=np.zeros(SHAPE, np.float32), block=False)
    opener = threading.Timer(0.2, gate.go.set)  # needs the GIL while the main thread waits
    opener.start()
    req.wait()
    opener.join()
    assert not gate.timed_out


# ---- updater views ----


def test_updater_gets_views_and_updates_in_place(store_type):
    kv = synkv.create(store_type)
    kv.init(3, np.ones(SHAPE, np.float32))
    seen = {}

    def updater(key, inp, stored):
        seen["input_writable"] = inp.flags.writeable
        seen["stored_writable"] = stored.flags.writeable
        base = stored
        while isinstance(base, np.ndarray):  # a view over the lent buffer, not a copy
            base = base.base
        seen["base"] = type(base).__name__
        seen["shape"] = stored.shape
        stored += inp * 3

    kv.set_updater(updater)
    kv.push(3, np.full(SHAPE, 2.0, np.float32))
    out = np.zeros(SHAPE, np.float32)
    kv.pull(3, out=out)
    np.testing.assert_array_equal(out, np.full(SHAPE, 7.0))
    assert seen == {"input_writable": False, "stored_writable": True, "base": "_LentBuffer", "shape": SHAPE}


def test_views_kept_after_the_updater_do_not_crash_or_reach_the_store():
    kv = synkv.create("local")
    kv.init(3, np.zeros(SHAPE, np.float64))
    kept = []

    def updater(key, inp, stored):
        stored += inp
        kept.append((inp, stored, stored[1:], memoryview(stored)))

    kv.set_updater(updater)
    for _ in range(3):
        kv.push(3, np.ones(SHAPE, np.float64))
    out = np.zeros(SHAPE, np.float64)
    kv.pull(3, out=out)
    np.testing.assert_array_equal(out, np.full(SHAPE, 3.0))
    # the escaped views hold the values of their call, and writing them is harmless
    for i, (inp, stored, tail, mv) in enumerate(kept):
        np.testing.assert_array_equal(inp, np.ones(SHAPE))
        np.testing.assert_array_equal(stored, np.full(SHAPE, float(i + 1)))
        stored[:] = 999.0
        tail[:] = -5.0
    kv.pull(3, out=out)
    np.testing.assert_array_equal(out, np.full(SHAPE, 3.0))
    del kv
    gc.collect()
    assert float(kept[0][1].sum()) == 999.0 * 4 + (-5.0) * 12
    kept.clear()
    gc.collect()


def test_updater_with_float16_and_int_keys_and_str_keys():
    kv = synkv.create("local")
    kv.init(["w"], [np.ones(SHAPE, np.float16)])
    kv.set_updater(lambda key, inp, stored: stored.__imul__(inp))
    kv.push("w", np.full(SHAPE, 4.0, np.float16))
    out = np.zeros(SHAPE, np.float16)
    kv.pull("w", out=out)
    np.testing.assert_array_equal(out, np.full(SHAPE, 4.0, np.float16))

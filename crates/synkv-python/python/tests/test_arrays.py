"""Values and outputs: zero-copy borrowing of numpy arrays, buffers and DLPack objects,
dtypes, layouts that are copied or refused, row-sparse values."""

import array

import numpy as np
import pytest

import synkv
from conftest import SHAPE, assert_all, ones, zeros


def store(value=None, key=3):
    kv = synkv.create("local")
    kv.init(key, zeros() if value is None else value)
    return kv


def test_pull_writes_into_the_callers_memory():
    kv = store(np.arange(16, dtype=np.float32).reshape(SHAPE))
    big = np.full(32, -1, dtype=np.float32)
    view = big[8:24].reshape(SHAPE)  # a view into the middle of `big`
    kv.pull(3, out=view)
    np.testing.assert_array_equal(big[8:24], np.arange(16))
    np.testing.assert_array_equal(big[:8], -1)
    np.testing.assert_array_equal(big[24:], -1)


def test_pull_into_a_buffer_protocol_object():
    kv = store(np.arange(16, dtype=np.float32).reshape(SHAPE))
    raw = bytearray(64)
    kv.pull(3, out=memoryview(raw).cast("B").cast("f", SHAPE))
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32), np.arange(16))
    floats = array.array("f", [0.0] * 16)
    kv.pull(3, out=memoryview(floats).cast("B").cast("f", SHAPE))
    assert list(floats) == list(range(16))


def test_push_from_a_buffer_protocol_object():
    kv = store(np.zeros(4, np.float32))
    kv.push(3, array.array("f", [1.5, 2.5, 3.5, 4.5]))
    out = np.zeros(4, np.float32)
    kv.pull(3, out=out)
    np.testing.assert_array_equal(out, [1.5, 2.5, 3.5, 4.5])


@pytest.mark.parametrize("with_updater", [False, True])
def test_push_returns_once_values_are_read(with_updater):
    """The caller may overwrite a pushed array as soon as push returns."""
    kv = synkv.create("local")
    keys = list(range(8))
    kv.init(keys, [np.zeros(1 << 16, np.float32) for _ in keys])
    if with_updater:
        kv.set_updater(lambda key, recv, stored: stored.__setitem__(slice(None), recv))
    grads = [np.full(1 << 16, k + 1, np.float32) for k in keys]
    kv.push(keys, grads)
    for g in grads:
        g[:] = 999  # reuse the gradient buffers at once
    outs = [np.zeros(1 << 16, np.float32) for _ in keys]
    kv.pull(keys, out=outs)
    for k, o in zip(keys, outs):
        assert_all(o, k + 1, f"key {k}")


def test_init_copies():
    v = ones()
    kv = store(v)
    v[:] = 7
    out = zeros()
    kv.pull(3, out=out)
    assert_all(out, 1, "init copies its value")


class DLPackOnly:
    """A producer with only the DLPack protocol (like a torch CPU tensor)."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kwargs):
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_dlpack_values_and_outputs():
    kv = store()
    kv.push(3, DLPackOnly(np.full(SHAPE, 3, np.float32)))
    backing = zeros()
    if not np.from_dlpack(DLPackOnly(backing)).flags.writeable:
        # numpy < 2.1 (unversioned DLPack) gives read-only views: refused as outputs
        with pytest.raises(ValueError, match="DLPack read-only"):
            kv.pull(3, out=DLPackOnly(backing))
        return
    kv.pull(3, out=DLPackOnly(backing))
    assert_all(backing, 3, "pulled through DLPack into the producer's memory")


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    kv = store()
    kv.push(3, [torch.ones(SHAPE), torch.ones(SHAPE)])
    out = torch.zeros(SHAPE)
    ptr = out.data_ptr()
    kv.pull(3, out=out)
    assert out.data_ptr() == ptr
    assert torch.all(out == 2)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_other_float_dtypes(dtype):
    kv = store(np.zeros(SHAPE, dtype))
    kv.push(3, [np.full(SHAPE, 1.5, dtype)] * 2)
    out = np.zeros(SHAPE, dtype)
    kv.pull(3, out=out)
    assert out.dtype == dtype
    assert_all(out, 3, str(dtype))
    out32 = zeros()
    kv.pull(3, out=out32)  # outputs of another dtype receive a converted copy
    assert_all(out32, 3, "converted")


def test_unsupported_dtype():
    kv = synkv.create("local")
    with pytest.raises(synkv.KVStoreDTypeError, match="uint8"):
        kv.init(3, np.zeros(SHAPE, np.uint8))
    with pytest.raises(synkv.KVStoreDTypeError, match="complex64"):
        kv.init(3, np.zeros(SHAPE, np.complex64))


def test_values_that_are_copied_first():
    kv = store()
    wide = np.arange(32, dtype=np.float32).reshape(4, 8)
    kv.push(3, wide[:, ::2])  # not contiguous
    out = zeros()
    kv.pull(3, out=out)
    np.testing.assert_array_equal(out, wide[:, ::2])
    fortran = np.asfortranarray(np.arange(16, dtype=np.float32).reshape(SHAPE))
    kv.push(3, fortran)
    kv.pull(3, out=out)
    np.testing.assert_array_equal(out, np.arange(16).reshape(SHAPE))
    readonly = np.full(SHAPE, 5, np.float32)
    readonly.setflags(write=False)
    kv.push(3, readonly)
    kv.pull(3, out=out)
    assert_all(out, 5, "read-only value")
    swapped = np.full(SHAPE, 6, dtype=">f4")
    kv.push(3, swapped)
    kv.pull(3, out=out)
    assert_all(out, 6, "big-endian value")


def test_outputs_that_are_refused():
    kv = store()
    with pytest.raises(ValueError, match="C-contiguous"):
        kv.pull(3, out=np.zeros((4, 8), np.float32)[:, ::2])
    readonly = zeros()
    readonly.setflags(write=False)
    with pytest.raises(ValueError, match="writable"):
        kv.pull(3, out=readonly)
    with pytest.raises(ValueError, match="writable"):
        kv.pushpull(3, readonly)  # in place: the values are outputs
    big = np.zeros(20, np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        kv.pull([3, 3], out=[big[0:16].reshape(SHAPE), big[4:20].reshape(SHAPE)])


def test_same_array_twice_is_one_array():
    kv = store()
    a = ones()
    kv.push(3, [a, a, a])
    kv.pull(3, out=[a, a])
    assert_all(a, 3, "pushed three times, pulled twice into one array")
    kv.pushpull(3, a, out=a)  # the value is also the output
    assert_all(a, 3, "pushpull(value=a, out=a)")


def test_argument_errors():
    kv = store()
    with pytest.raises(TypeError, match="expected an array"):
        kv.push(3, [[1.0, 2.0]])
    with pytest.raises(TypeError, match="keys are int or str"):
        kv.push(np.int64(3), ones())
    with pytest.raises(OverflowError):
        kv.push(2**40, ones())
    with pytest.raises(TypeError, match="needs `out`"):
        kv.pull(3)
    with pytest.raises(TypeError, match="name must be a string"):
        synkv.create(3)


def test_row_sparse_values():
    kv = synkv.create("local")
    dense = np.zeros(SHAPE, np.float32)
    dense[1] = 2
    dense[3] = 4
    value = synkv.row_sparse_array(dense)
    assert value.indices.tolist() == [1, 3]
    kv.init("w", value)
    out = zeros()
    kv.pull("w", out=out)
    np.testing.assert_array_equal(out, dense)
    part = synkv.RowSparseNDArray.zeros(SHAPE)
    kv.row_sparse_pull("w", out=part, row_ids=[3, 0, 3])
    assert part.indices.tolist() == [0, 3]
    np.testing.assert_array_equal(part.data, [[0] * 4, [4] * 4])
    kv.row_sparse_pull("w", out=part, row_ids=np.array([], np.int64))
    assert part.indices.tolist() == [] and part.data.shape == (0, 4)
    # push row_sparse into the row_sparse key: assigned
    kv.push("w", synkv.RowSparseNDArray(np.ones((1, 4), np.float32), [2], SHAPE))
    full = synkv.RowSparseNDArray.zeros(SHAPE)
    kv.pull("w", out=full, ignore_sparse=False)
    expected = np.zeros(SHAPE, np.float32)
    expected[2] = 1
    np.testing.assert_array_equal(full.todense(), expected)
    with pytest.raises(synkv.KVStoreError, match="row ids"):
        synkv.create("local").init(1, synkv.RowSparseNDArray(np.ones((2, 4), np.float32), [3, 1], SHAPE))

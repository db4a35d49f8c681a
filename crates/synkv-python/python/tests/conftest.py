"""Shared helpers for the synkv pytest suite (spec K11 conventions: shape (4, 4), int keys
3 / [5, 7, 11], str keys 'a' / ['b', 'c', 'd'], stores initialised with zeros).

The job variables of the caller's shell (SYNKV_*, DMLC_*, RUST_BACKTRACE, RANK, SLURM_*, ...)
are removed from this process before synkv is imported, and the processes the tests start get
``envs.clean_env(...)``: no test depends on the environment it is run from (envs.py)."""

from envs import scrub_process_environment

scrub_process_environment()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import synkv  # noqa: E402

SHAPE = (4, 4)
STORE_TYPES = ["local", "device"]

INT_KEYS = {"single": 3, "list": [5, 7, 11], "other": 6, "other_list": [10, 14, 22]}
STR_KEYS = {"single": "a", "list": ["b", "c", "d"], "other": "aa", "other_list": ["bb", "cc", "dd"]}


@pytest.fixture(params=STORE_TYPES)
def store_type(request):
    return request.param


@pytest.fixture(params=[INT_KEYS, STR_KEYS], ids=["int", "str"])
def keys(request):
    return request.param


def zeros(shape=SHAPE, dtype=np.float32):
    return np.zeros(shape, dtype=dtype)


def ones(shape=SHAPE, dtype=np.float32):
    return np.ones(shape, dtype=dtype)


def rsp(dense):
    """A row_sparse array holding every row of `dense` (MXNet's `x.tostype('row_sparse')` of a
    value without zero rows; for zeros, no row)."""
    return synkv.row_sparse_array(dense)


def make_value(stype, value):
    return rsp(value) if stype == "row_sparse" else value


def init_kv(store_type, keys, stype="default"):
    """Upstream's `init_kv`: the single key and the list initialised with zeros."""
    kv = synkv.create(store_type)
    kv.init(keys["single"], make_value(stype, zeros()))
    kv.init(keys["list"], [make_value(stype, zeros()) for _ in keys["list"]])
    return kv


def assert_all(arr, value, what=""):
    arr = arr.todense() if isinstance(arr, synkv.RowSparseNDArray) else np.asarray(arr)
    np.testing.assert_allclose(arr, np.full(arr.shape, value, dtype=arr.dtype), rtol=1e-6, err_msg=what)

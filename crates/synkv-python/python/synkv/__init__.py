"""synkv — a parameter-synchronisation key-value store (MXNet's KVStore, rebuilt in Rust).

A store keeps one n-d array per key. Workers ``push`` gradients (a list of per-device values
is summed, then an updater runs on the sum, or the sum is assigned) and ``pull`` weights back::

    import numpy as np
    import synkv

    kv = synkv.create("local")
    kv.init(3, np.ones((2, 3), dtype=np.float32))
    kv.push(3, [np.ones((2, 3), np.float32)] * 4)      # summed: 4
    out = np.empty((2, 3), dtype=np.float32)
    kv.pull(3, out=out)                                 # written in place
    assert (out == 4).all()

The API mirrors ``mxnet.kv`` (names, arguments, semantics). Differences worth knowing:

* Values and outputs are numpy arrays, objects with ``__dlpack__`` (torch CPU tensors) or
  with the buffer protocol; they are used **without copying**. Outputs are written in place
  and must be writable C-contiguous arrays; a value that is not C-contiguous (or is
  read-only, misaligned or byte-swapped) is copied first.
* Supported dtypes: float32, float64, float16 (int32/int64 for row ids). bfloat16 is not
  supported from Python (numpy has no bfloat16).
* ``push`` returns once its values have been read (you may reuse them at once), before the
  updater or optimizer has run; ``pull``/``pushpull``/``broadcast``/``row_sparse_pull``
  return once their outputs are written. The GIL is released meanwhile, so other threads
  run. Do not write to an array from another thread while a call that uses it is running.
* ``push``/``pull``/``pushpull`` take ``block=False`` and then return a :class:`Request` at
  once: ``req.wait()`` (releases the GIL, raises the call's error) and ``req.done()``. Leave
  the arrays alone until it has completed.
* Row-sparse values are :class:`RowSparseNDArray` objects.
* Updaters get ``(key, input, stored)`` with int keys as ``int`` and str keys as ``str`` (MXNet
  passes ``bytes``); ``input`` and ``stored`` are numpy views of the store's buffers
  (read-only and writable), valid during the call only, and the updater must change
  ``stored`` in place. An exception in the updater is raised (as
  :class:`UpdaterError`, with the exception as ``__cause__``) by the next ``pull`` of that key
  or by ``wait_all``.
* Errors are :class:`KVStoreError` or one of its subclasses.

Optimizers run inside the store: ``kv.set_optimizer(synkv.optimizer.SGD(momentum=0.9))``
(:mod:`synkv.optimizer`, :mod:`synkv.lr_scheduler`), with ``save_optimizer_states`` /
``load_optimizer_states``.

Distributed stores (``dist_sync``, ``dist_async``, ``dist_device_sync``) work in processes
started by ``synkv launch -n W -s S -- python train.py``; ``kv.close()`` (or interpreter exit)
leaves the cluster: it waits until every worker has finished, however long that takes, and
a failure there (a dead node) makes the interpreter exit with status 1 rather than pass
silently. ``kv.set_gradient_compression({'type': '2bit', 'threshold': 0.5})`` works on
``device`` and dist stores (``local`` refuses, as MXNet).
"""

from __future__ import annotations

import atexit as _atexit
from typing import Any, Optional, Sequence

import numpy as _np

from . import _native, lr_scheduler, optimizer
from ._native import (
    KVStore,
    KVStoreDTypeError,
    KVStoreError,
    KVStoreKeyError,
    KVStoreShapeError,
    KVStoreUnsupportedError,
    Request,
    UpdaterError,
    create,
)

__version__ = _native.__version__

__all__ = [
    "KVStore",
    "KVStoreDTypeError",
    "KVStoreError",
    "KVStoreKeyError",
    "KVStoreShapeError",
    "KVStoreUnsupportedError",
    "Request",
    "RowSparseNDArray",
    "UpdaterError",
    "create",
    "lr_scheduler",
    "optimizer",
    "row_sparse_array",
]

def _at_exit() -> None:
    """Finishes every scheduled operation before the interpreter shuts down (so that no updater
    runs Python code during finalisation) and leaves the cluster. A dist store that could not
    close cleanly (a node died, the job failed) ends the process with status 1: the failure is
    printed, and a launcher or scheduler sees a failed worker instead of a successful one."""
    failures = _native._drain()
    if failures:
        import os
        import sys

        for f in failures:
            print(f"synkv: error at exit: {f}", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed stream cannot hide the exit status
                pass
        os._exit(1)


_atexit.register(_at_exit)


class RowSparseNDArray:
    """A row-sparse array: the rows ``indices`` of a ``shape``-shaped array, stored in ``data``.

    ``indices`` are sorted, unique int64 row ids; ``data`` has shape
    ``(len(indices),) + shape[1:]``; absent rows are zero. Use it as a value for
    ``init``/``push`` and as an output of ``row_sparse_pull`` (or of ``pull`` with
    ``ignore_sparse=False``): outputs get new ``data`` and ``indices`` arrays.
    """

    stype: str = "row_sparse"
    data: _np.ndarray
    indices: _np.ndarray
    shape: "tuple[int, ...]"

    def __init__(self, data: Any, indices: Any, shape: Sequence[int]) -> None:
        self.shape = tuple(int(d) for d in shape)
        if len(self.shape) == 0:
            raise ValueError("a row_sparse array needs at least one dimension")
        self.indices = _np.asarray(indices, dtype=_np.int64).reshape(-1)
        data = _np.asarray(data)
        self.data = data.reshape((len(self.indices),) + self.shape[1:])

    @classmethod
    def zeros(cls, shape: Sequence[int], dtype: Any = _np.float32) -> "RowSparseNDArray":
        """An all-zero row-sparse array (no stored row)."""
        shape = tuple(int(d) for d in shape)
        return cls(_np.zeros((0,) + shape[1:], dtype=dtype), _np.zeros(0, dtype=_np.int64), shape)

    @classmethod
    def from_dense(cls, dense: Any, rows: Optional[Any] = None) -> "RowSparseNDArray":
        """The rows ``rows`` of ``dense`` (default: its non-zero rows)."""
        dense = _np.asarray(dense)
        if rows is None:
            flat = dense.reshape(dense.shape[0], -1)
            rows = _np.flatnonzero((flat != 0).any(axis=1))
        rows = _np.unique(_np.asarray(rows, dtype=_np.int64))
        return cls(dense[rows].copy(), rows, dense.shape)

    @property
    def dtype(self) -> _np.dtype:
        """The element dtype."""
        return self.data.dtype

    def todense(self) -> _np.ndarray:
        """A dense numpy copy."""
        out = _np.zeros(self.shape, dtype=self.data.dtype)
        out[self.indices] = self.data
        return out

    asnumpy = todense

    def __repr__(self) -> str:
        return f"RowSparseNDArray(shape={self.shape}, dtype={self.dtype}, indices={self.indices.tolist()})"


def row_sparse_array(dense: Any, rows: Optional[Any] = None) -> RowSparseNDArray:
    """Shorthand for :meth:`RowSparseNDArray.from_dense` (``mx.nd.array(x).tostype('row_sparse')``)."""
    return RowSparseNDArray.from_dense(dense, rows)

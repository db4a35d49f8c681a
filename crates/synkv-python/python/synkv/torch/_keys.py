"""Store keys of :mod:`synkv.torch`: named, initialised once, collectively.

Every worker must create the same keys in the same order (``init`` on a dist store is a
collective call ending in a barrier), which holds when every worker runs the same script.
Keys are strings under the ``torch/`` prefix, so they never clash with a user's own keys.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np
import torch

from . import _context

_lock = threading.Lock()
# key -> (shape, dtype) of the keys this process has initialised.
_known: Dict[str, Tuple[Tuple[int, ...], torch.dtype]] = {}
_unnamed = itertools.count()


def unnamed(kind: str) -> str:
    """A name for an operation the caller did not name (the n-th such call of this process)."""
    return f"{kind}.noname.{next(_unnamed)}"


def ensure(keys: Sequence[str], like: Sequence[torch.Tensor], zeros: bool = True) -> List[str]:
    """Initialises the keys not yet known (with zeros, or with the tensors' values: rank 0's
    are kept), in one collective call; checks known keys against their shapes and dtypes.
    Returns the keys that were new."""
    values = [(lambda t=t: torch.zeros_like(t, memory_format=torch.contiguous_format)) if zeros else (lambda t=t: t.detach().contiguous()) for t in like]
    return _ensure(keys, values, [tuple(t.shape) for t in like], [t.dtype for t in like])


def ensure_values(keys: Sequence[str], values: Sequence[Any], shapes: Sequence[Tuple[int, ...]], dtype: torch.dtype) -> List[str]:
    """:func:`ensure` with prepared init values (e.g. row_sparse ones) of the given shapes."""
    return _ensure(keys, [(lambda v=v: v) for v in values], [tuple(s) for s in shapes], [dtype] * len(keys))


def _ensure(keys: Sequence[str], makers: Sequence[Callable[[], Any]], shapes: Sequence[Tuple[int, ...]], dtypes: Sequence[torch.dtype]) -> List[str]:
    new: List[Tuple[str, Callable[[], Any]]] = []
    with _lock:
        for k, make, shape, dtype in zip(keys, makers, shapes, dtypes):
            seen = _known.get(k)
            if seen is None:
                new.append((k, make))
                _known[k] = (shape, dtype)
            elif seen != (shape, dtype):
                raise ValueError(
                    f"{k!r} was first used with shape {list(seen[0])} and {seen[1]}, now with {list(shape)} and {dtype}; "
                    "give tensors of another shape another name"
                )
    if new:
        kv = _context.store()
        try:
            kv.init([k for k, _ in new], [make() for _, make in new])
        except BaseException:
            with _lock:
                for k, _ in new:
                    _known.pop(k, None)
            raise
    return [k for k, _ in new]


def forget_all() -> None:
    """Forgets every key (after the store was closed)."""
    with _lock:
        _known.clear()


def as_numpy_ids(ids: torch.Tensor) -> np.ndarray:
    """Row ids as an int64 numpy array."""
    return ids.detach().to(torch.int64).contiguous().numpy()

"""Type stubs of synkv's native module (``synkv._native``); import these names from ``synkv``."""

import os
from typing import Any, Callable, Optional, Protocol, Sequence, Union

import numpy as np

__version__: str

class _SupportsDLPack(Protocol):
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __dlpack_device__(self) -> Any: ...

class _SupportsToJson(Protocol):
    def to_json(self) -> str: ...

class _RowSparse(Protocol):
    """A row-sparse value, e.g. :class:`synkv.RowSparseNDArray`."""

    stype: str
    data: Any
    indices: Any
    shape: Sequence[int]

#: One array: a numpy array, an object with ``__dlpack__`` (torch CPU tensor), an object with
#: the buffer protocol, or a row-sparse value.
Array = Union[np.ndarray, _SupportsDLPack, memoryview, bytearray, _RowSparse]
#: One array, a list of arrays (one per device, or one per key), or a list of lists.
Arrays = Union[Array, Sequence[Array], Sequence[Sequence[Array]]]
Key = Union[int, str]
Keys = Union[Key, Sequence[Key]]
#: ``updater(key, input, stored)``: change ``stored`` (a numpy array) in place.
Updater = Callable[[Key, np.ndarray, np.ndarray], Any]
RowIds = Union[Array, Sequence[int], Sequence[Array], Sequence[Sequence[Array]]]

class KVStoreError(Exception):
    """Base class of every error a synkv store raises."""

class KVStoreKeyError(KVStoreError):
    """A key was never initialised, initialised twice, or of the other kind (int vs str)."""

class KVStoreShapeError(KVStoreError):
    """A value or output has another shape than the key."""

class KVStoreDTypeError(KVStoreError):
    """A value has another dtype than the key, or a dtype synkv cannot hold."""

class KVStoreUnsupportedError(KVStoreError):
    """The operation is not supported by this store type or storage type."""

class UpdaterError(KVStoreError):
    """The updater raised (see ``__cause__``) or left the stored value unusable."""

class KVStore:
    """A key-value store of n-d arrays (MXNet's ``KVStore``); create one with :func:`create`.

    Every method borrows its arrays without copying, releases the GIL while it works or
    waits, and returns once the store is done with the arrays: ``init``/``push`` once the
    values have been read, the others once the outputs are written.
    """

    @property
    def type(self) -> str:
        """The store type as given to :func:`create`, lower-cased."""
    @property
    def rank(self) -> int:
        """This worker's rank (0 for in-process stores)."""
    @property
    def num_workers(self) -> int:
        """The number of workers (1 for in-process stores)."""
    def init(self, key: Keys, value: Arrays) -> None:
        """Initialises keys with values (copied). Each key is initialised once."""
    def push(self, key: Keys, value: Arrays, priority: int = 0) -> None:
        """Pushes values: the values of one key are summed, then the updater runs on the sum
        (or the sum is assigned). Returns once the values have been read."""
    def pull(self, key: Keys, out: Optional[Arrays] = None, priority: int = 0, ignore_sparse: bool = True) -> None:
        """Pulls values into ``out`` in place (a list of outputs for one key: each gets the
        value). With ``ignore_sparse`` row-sparse outputs are skipped with a warning."""
    def pushpull(self, key: Keys, value: Arrays, out: Optional[Arrays] = None, priority: int = 0) -> None:
        """Push then pull as one call; with ``out=None`` the result is written into ``value``."""
    def broadcast(self, key: Keys, value: Arrays, out: Arrays, priority: int = 0) -> None:
        """``init(key, value)`` then ``pull(key, out)``."""
    def row_sparse_pull(self, key: Keys, out: Optional[Arrays] = None, priority: int = 0, row_ids: Optional[RowIds] = None) -> None:
        """Pulls the rows ``row_ids`` of row-sparse keys into row-sparse outputs."""
    def set_updater(self, updater: Optional[Updater]) -> None:
        """Installs ``updater(key, input, stored)``; ``None`` restores assign."""
    def _set_updater(self, updater: Optional[Updater]) -> None:
        """MXNet's name for :meth:`set_updater`."""
    def set_gradient_compression(self, compression_params: "dict[str, Any]") -> None: ...
    def set_optimizer(self, optimizer: Union[_SupportsToJson, str]) -> None:
        """Installs an optimizer (a :mod:`synkv.optimizer` object, or its JSON): every push
        then runs it on the summed gradient of each key; states start empty."""
    def save_optimizer_states(self, fname: Union[str, "os.PathLike[str]"], dump_optimizer: bool = False) -> None:
        """Saves the optimizer's states (and configuration) once scheduled updates have run."""
    def load_optimizer_states(self, fname: Union[str, "os.PathLike[str]"]) -> None:
        """Loads states saved by :meth:`save_optimizer_states` into the installed optimizer."""
    def is_capable(self, capability: str) -> bool:
        """Whether the store supports a capability (``"optimizer"``: True)."""
    def barrier(self) -> None:
        """A barrier across workers (a no-op for in-process stores)."""
    def _barrier(self) -> None:
        """MXNet's name for :meth:`barrier`."""
    def close(self) -> None:
        """Waits for scheduled work; a dist worker then leaves the cluster."""
    def __enter__(self) -> "KVStore": ...
    def __exit__(self, *exc: Any) -> None: ...
    def wait_all(self) -> None:
        """Waits for every scheduled operation; raises the first error one raised since the
        last ``wait_all``."""

def create(name: str = "local") -> KVStore:
    """Creates a store: ``local``, ``device``, or one of MXNet's aliases."""

def _drain() -> None: ...

"""Type stubs of synkv's native module (``synkv._native``); import these names from ``synkv``."""

import os
from typing import Any, Callable, Literal, Optional, Protocol, Sequence, Union, overload

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
#: ``updater(key, input, stored)``: change ``stored`` in place. For dense keys ``stored`` is a
#: writable numpy view of the store's own buffer and ``input`` a read-only view of the summed
#: push, valid during the call (a view kept afterwards is detached from the store).
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

class Request:
    """A non-blocking call in flight: what ``push``/``pull``/``pushpull`` return with
    ``block=False``. It keeps the call's arrays alive until it has completed; do not write
    its values or read its outputs before then."""

    def wait(self) -> None:
        """Waits (releasing the GIL) until the call is done with its arrays: values consumed,
        outputs written. Raises the call's error (a :class:`KVStoreError`), every time."""
    def done(self) -> bool:
        """Whether the call has completed (``wait()`` then returns or raises at once); never
        blocks."""

class KVStore:
    """A key-value store of n-d arrays (MXNet's ``KVStore``); create one with :func:`create`.

    Every method borrows its arrays without copying, releases the GIL while it works or
    waits, and returns once the store is done with the arrays: ``init``/``push`` once the
    values have been read (with an updater or optimizer, before the update has run), the
    others once the outputs are written. ``push``, ``pull`` and ``pushpull`` take
    ``block=False`` to return a :class:`Request` at once instead.
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
    @overload
    def push(self, key: Keys, value: Arrays, priority: int = 0, *, block: Literal[True] = True) -> None: ...
    @overload
    def push(self, key: Keys, value: Arrays, priority: int = 0, *, block: Literal[False]) -> Request: ...
    def push(self, key: Keys, value: Arrays, priority: int = 0, *, block: bool = True) -> Optional[Request]:
        """Pushes values: the values of one key are summed, then the updater runs on the sum
        (or the sum is assigned). Returns once the values have been read (you may overwrite
        them), before the update has run. ``block=False``: returns a :class:`Request` at once."""
    @overload
    def pull(
        self, key: Keys, out: Optional[Arrays] = None, priority: int = 0, ignore_sparse: bool = True, *, block: Literal[True] = True
    ) -> None: ...
    @overload
    def pull(
        self, key: Keys, out: Optional[Arrays] = None, priority: int = 0, ignore_sparse: bool = True, *, block: Literal[False]
    ) -> Request: ...
    def pull(
        self, key: Keys, out: Optional[Arrays] = None, priority: int = 0, ignore_sparse: bool = True, *, block: bool = True
    ) -> Optional[Request]:
        """Pulls values into ``out`` in place (a list of outputs for one key: each gets the
        value). With ``ignore_sparse`` row-sparse outputs are skipped with a warning.
        ``block=False``: returns a :class:`Request`; ``out`` is written once it is done."""
    @overload
    def pushpull(
        self, key: Keys, value: Arrays, out: Optional[Arrays] = None, priority: int = 0, *, block: Literal[True] = True
    ) -> None: ...
    @overload
    def pushpull(
        self, key: Keys, value: Arrays, out: Optional[Arrays] = None, priority: int = 0, *, block: Literal[False]
    ) -> Request: ...
    def pushpull(
        self, key: Keys, value: Arrays, out: Optional[Arrays] = None, priority: int = 0, *, block: bool = True
    ) -> Optional[Request]:
        """Push then pull as one call; with ``out=None`` the result is written into ``value``.
        ``block=False``: returns a :class:`Request` at once."""
    @overload
    def broadcast(self, key: Keys, value: Arrays, out: Arrays, priority: int = 0, *, block: Literal[True] = True) -> None: ...
    @overload
    def broadcast(self, key: Keys, value: Arrays, out: Arrays, priority: int = 0, *, block: Literal[False]) -> Request: ...
    def broadcast(self, key: Keys, value: Arrays, out: Arrays, priority: int = 0, *, block: bool = True) -> Optional[Request]:
        """``init(key, value)`` then ``pull(key, out)``. ``block=False``: returns a
        :class:`Request` once the keys are initialised; ``out`` is written once it is done."""
    @overload
    def row_sparse_pull(
        self, key: Keys, out: Optional[Arrays] = None, priority: int = 0, row_ids: Optional[RowIds] = None, *, block: Literal[True] = True
    ) -> None: ...
    @overload
    def row_sparse_pull(
        self, key: Keys, out: Optional[Arrays] = None, priority: int = 0, row_ids: Optional[RowIds] = None, *, block: Literal[False]
    ) -> Request: ...
    def row_sparse_pull(
        self, key: Keys, out: Optional[Arrays] = None, priority: int = 0, row_ids: Optional[RowIds] = None, *, block: bool = True
    ) -> Optional[Request]:
        """Pulls the rows ``row_ids`` of row-sparse keys into row-sparse outputs.
        ``block=False``: returns a :class:`Request`; the outputs are filled by its ``wait()``."""
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
    def checkpoint(self, dir: str | os.PathLike[str]) -> tuple[int, int]:
        """Takes a consistent checkpoint of a dist job's servers into ``dir`` (every worker calls
        it at the same point of training); returns ``(id, round)``. A job started with
        ``SYNKV_CHECKPOINT_DIR=dir`` resumes from the newest one."""
    @property
    def resumed_round(self) -> Optional[int]:
        """The round of the checkpoint this dist job resumed from, or None."""
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

def _drain() -> list[str]: ...

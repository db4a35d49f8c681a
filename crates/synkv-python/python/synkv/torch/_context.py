"""The process's synkv store for :mod:`synkv.torch`: ``init``, ranks and sizes, ``shutdown``.

One store per process, created by :func:`init`. Its type is the argument, else
``SYNKV_KVSTORE``, else ``dist_sync`` when the process was started as part of a job (by
``synkv launch``, torchrun, Slurm, MPI: see ``docs/torch.md``), else ``local`` (one process).
"""

from __future__ import annotations

import os
import threading
from typing import Optional

import synkv

_lock = threading.Lock()
_kv: Optional["synkv.KVStore"] = None
#: Whether a server-side optimizer was set on the store (pushes then go through it).
_server_optimizer = False
#: The store's gradient compression parameters, once set.
_compression: "Optional[dict[str, object]]" = None

# (rank, world size) variables of the job launchers synkv knows, in the order it reads them.
_JOB_VARS = [
    ("SYNKV_RANK", "SYNKV_WORLD_SIZE"),
    ("RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
]
# (local rank, local size) variables, in the same order.
_LOCAL_VARS = [
    ("SYNKV_LOCAL_RANK", "SYNKV_LOCAL_WORLD_SIZE"),
    ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
]


def _in_job() -> bool:
    """Whether this process is one of several of a job (so a dist store is the default)."""
    if os.environ.get("DMLC_PS_ROOT_URI"):
        return True
    for _, size in _JOB_VARS:
        value = os.environ.get(size, "").strip()
        if value.isdigit() and int(value) > 1:
            return True
    return False


def init(kvstore: Optional[str] = None) -> "synkv.KVStore":
    """Creates this process's store (once; later calls return it). Call it on every worker
    before anything else of :mod:`synkv.torch`, like ``hvd.init()``.

    ``kvstore``: ``"dist_sync"`` (default in a job), ``"dist_async"`` (asynchronous training:
    needs an optimizer on the servers, see :class:`DistributedOptimizer`), ``"local"``
    (default outside a job), or ``"device"``.
    """
    global _kv
    with _lock:
        if _kv is None:
            name = kvstore or os.environ.get("SYNKV_KVSTORE", "").strip() or ("dist_sync" if _in_job() else "local")
            _kv = synkv.create(name)
        elif kvstore is not None and kvstore != _kv.type:
            raise ValueError(f"synkv.torch is already initialised with a {_kv.type!r} store; call shutdown() before init({kvstore!r})")
        return _kv


def store() -> "synkv.KVStore":
    """The store :func:`init` made (raises if it was not called)."""
    if _kv is None:
        raise RuntimeError("synkv.torch is not initialised: call synkv.torch.init() first")
    return _kv


def is_initialized() -> bool:
    """Whether :func:`init` has made a store (and :func:`shutdown` has not closed it)."""
    return _kv is not None


def shutdown() -> None:
    """Closes the store: waits for every operation, then (dist) until every worker is done."""
    global _kv, _server_optimizer, _compression
    with _lock:
        kv, _kv = _kv, None
        _server_optimizer = False
        _compression = None
    if kv is not None:
        from . import _keys

        _keys.forget_all()
        kv.close()


def rank() -> int:
    """This worker's rank, in ``0..size()``."""
    return store().rank


def size() -> int:
    """The number of workers."""
    return store().num_workers


def is_async() -> bool:
    """Whether the store is asynchronous (``dist_async``)."""
    return store().type == "dist_async"


def _local() -> "tuple[int, int]":
    for r, s in _LOCAL_VARS:
        rv, sv = os.environ.get(r, "").strip(), os.environ.get(s, "").strip()
        if rv.isdigit():
            n = int(sv) if sv.isdigit() else None
            if n is None and r == "SLURM_LOCALID":
                # SLURM_TASKS_PER_NODE reads like "2(x3),1"; this node's count is not
                # always the first, so only the uniform case is trusted.
                tpn = os.environ.get("SLURM_TASKS_PER_NODE", "").split("(")[0].split(",")[0]
                n = int(tpn) if tpn.isdigit() else None
            return int(rv), (n if n is not None else int(rv) + 1)
    if os.environ.get("DMLC_JOB_CLUSTER") == "local" or not _in_job():
        # `synkv launch` without hosts: every worker on this host.
        return rank(), size()
    return 0, 1


def local_rank() -> int:
    """This worker's rank among the workers on its host (``LOCAL_RANK``, ``SLURM_LOCALID``,
    ``OMPI_COMM_WORLD_LOCAL_RANK``; every worker of a local ``synkv launch`` is on one host)."""
    return _local()[0]


def local_size() -> int:
    """The number of workers on this host (see :func:`local_rank`)."""
    return _local()[1]


def set_compression(params: "Optional[dict[str, object]]") -> None:
    """Turns on the store's gradient compression (store-wide: every float32 push of this
    process is quantized from then on); a second, different setting is refused. ``None``
    (no quantizer) and a ``local`` store (nothing travels) leave the store as it is."""
    global _compression
    kv = store()
    if params is None or kv.type == "local":
        return
    if _compression is not None:
        if _compression != params:
            raise ValueError(f"gradient compression is already {_compression}; synkv compresses every push of a store alike, so one setting per job")
        return
    kv.set_gradient_compression(dict(params))
    _compression = dict(params)


def compression() -> "Optional[dict[str, object]]":
    """The store's gradient compression, if turned on."""
    return _compression


def _mark_server_optimizer() -> None:
    global _server_optimizer
    _server_optimizer = True


def has_server_optimizer() -> bool:
    """Whether an optimizer runs on the servers (set by a server-side
    :class:`DistributedOptimizer` or :func:`set_server_optimizer`)."""
    return _server_optimizer

"""Embedding tables that live on the servers: ``SparseEmbedding`` and ``SparseEmbeddingBag``.

The table is cut into shards of rows (each a row_sparse key, spread over the servers), so it
may be far larger than one worker's memory. A forward pulls only the rows its batch uses
(``row_sparse_pull``); backward pushes only their gradients (row_sparse), and the servers'
optimizer (set by a server-side :class:`~synkv.torch.DistributedOptimizer`, required) updates
just those rows. With ``dist_sync`` every worker pushes every shard each step (shards it did not
touch as empty pushes), so rounds line up; with ``dist_async`` only touched shards travel.
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np
import torch
import torch.nn.functional as F

import synkv

from . import _context, _keys

_DEFAULT_SHARD_BYTES = 64 << 20


class SparseEmbedding(torch.nn.Module):
    """``nn.Embedding(num_embeddings, embedding_dim)`` whose weight lives on the servers.

    ``name`` must be unique in the job (it names the keys). Rows start as
    ``normal(0, init_std)`` from a generator seeded with ``seed`` (the same on every worker; rank
    0's are kept), or zeros with ``init_std=0``. ``shard_rows`` bounds the rows per key
    (default: 64 MiB of rows).
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        name: str,
        dtype: torch.dtype = torch.float32,
        init_std: float = 0.01,
        seed: int = 0,
        shard_rows: Optional[int] = None,
    ):
        super().__init__()
        if num_embeddings < 1 or embedding_dim < 1:
            raise ValueError("num_embeddings and embedding_dim must be >= 1")
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.name = name
        self.dtype = dtype
        row_bytes = self.embedding_dim * torch.tensor([], dtype=dtype).element_size()
        self.shard_rows = int(shard_rows or max(1, _DEFAULT_SHARD_BYTES // row_bytes))
        self.num_shards = (self.num_embeddings + self.shard_rows - 1) // self.shard_rows
        self._keys = [f"torch/emb/{name}/{s}" for s in range(self.num_shards)]
        self._pending: List[Any] = []
        kv = _context.store()
        self._sync = kv.type != "dist_async"
        if dtype not in (torch.float32, torch.float16, torch.float64):
            raise TypeError("SparseEmbedding holds float32, float16 or float64 rows")
        self._np_dtype = torch.zeros(0, dtype=dtype).numpy().dtype
        # One shard at a time, so no worker ever holds the whole table.
        for s, key in enumerate(self._keys):
            rows = self._rows_in(s)
            g = torch.Generator().manual_seed(seed * 1_000_003 + s)
            data = torch.randn(rows, self.embedding_dim, generator=g, dtype=torch.float32).mul_(init_std) if init_std else torch.zeros(rows, self.embedding_dim)
            value = synkv.RowSparseNDArray(data.to(dtype).numpy(), np.arange(rows, dtype=np.int64), (rows, self.embedding_dim))
            _keys.ensure_values([key], [value], [(rows, self.embedding_dim)], dtype)

    def _rows_in(self, shard: int) -> int:
        return min(self.shard_rows, self.num_embeddings - shard * self.shard_rows)

    def _wait(self) -> None:
        for r in self._pending:
            r.wait()
        self._pending.clear()

    def rows(self, ids: torch.Tensor) -> "tuple[torch.Tensor, torch.Tensor]":
        """The unique ids of ``ids`` (sorted), and a fresh leaf tensor of their rows pulled
        from the servers, whose gradient is pushed back in backward."""
        if ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{self.name}: ids must be int32 or int64, got {ids.dtype}")
        uniq = torch.unique(ids.reshape(-1))
        if uniq.numel() and (uniq[0] < 0 or uniq[-1] >= self.num_embeddings):
            raise IndexError(f"{self.name}: ids must be in 0..{self.num_embeddings - 1}, got {int(uniq[0])}..{int(uniq[-1])}")
        self._wait()  # read this worker's own last update
        bounds = self._bounds(uniq)
        keys, outs, ids_per = [], [], []
        for s in range(self.num_shards):
            lo, hi = bounds[s], bounds[s + 1]
            if lo == hi:
                continue
            keys.append(self._keys[s])
            outs.append(synkv.RowSparseNDArray.zeros((self._rows_in(s), self.embedding_dim), dtype=self._np_dtype))
            ids_per.append(_keys.as_numpy_ids(uniq[lo:hi] - s * self.shard_rows))
        if keys:
            _context.store().row_sparse_pull(keys, out=outs, row_ids=ids_per)
        data = torch.cat([torch.from_numpy(o.data) for o in outs]) if outs else torch.zeros(0, self.embedding_dim, dtype=self.dtype)
        leaf = data.requires_grad_(self.training and torch.is_grad_enabled())
        if leaf.requires_grad:
            leaf.register_hook(lambda g, uniq=uniq, bounds=bounds: self._push(uniq, bounds, g))
        return uniq, leaf

    def _bounds(self, uniq: torch.Tensor) -> "list[int]":
        """Where each shard's ids start in the sorted ``uniq`` (and the end): shard ``s`` holds
        ``uniq[b[s]:b[s+1]]``."""
        starts = torch.arange(0, self.num_shards + 1, dtype=uniq.dtype) * self.shard_rows
        return torch.searchsorted(uniq, starts).tolist()

    def _push(self, uniq: torch.Tensor, bounds: "list[int]", grad: torch.Tensor) -> None:
        if not _context.has_server_optimizer():
            raise RuntimeError(
                f"{self.name}: a SparseEmbedding is trained by an optimizer on the servers; "
                "wrap a synkv optimizer: DistributedOptimizer(synkv.optimizer.AdaGrad(...), named_parameters=model.named_parameters())"
            )
        grad = grad.contiguous()
        keys, values = [], []
        for s in range(self.num_shards):
            lo, hi = bounds[s], bounds[s + 1]
            if lo == hi and not self._sync:
                continue  # dist_sync: every shard is pushed every step, so rounds line up
            keys.append(self._keys[s])
            values.append(synkv.RowSparseNDArray(grad[lo:hi].numpy(), _keys.as_numpy_ids(uniq[lo:hi] - s * self.shard_rows), (self._rows_in(s), self.embedding_dim)))
        if keys:
            self._pending.append(_context.store().push(keys, values, block=False))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        uniq, leaf = self.rows(ids)
        inverse = torch.searchsorted(uniq, ids.reshape(-1)).view(ids.shape)
        return F.embedding(inverse, leaf)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, name={self.name!r}, shards={self.num_shards}"


class SparseEmbeddingBag(SparseEmbedding):
    """``nn.EmbeddingBag`` (``mode`` ``"sum"``, ``"mean"`` or ``"max"``) over a table on the
    servers; see :class:`SparseEmbedding`."""

    def __init__(self, num_embeddings: int, embedding_dim: int, name: str, mode: str = "mean", **kwargs: Any):
        super().__init__(num_embeddings, embedding_dim, name, **kwargs)
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"mode must be 'sum', 'mean' or 'max', got {mode!r}")
        self.mode = mode

    def forward(self, ids: torch.Tensor, offsets: Optional[torch.Tensor] = None, per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:  # type: ignore[override]
        uniq, leaf = self.rows(ids)
        inverse = torch.searchsorted(uniq, ids.reshape(-1)).view(ids.shape)
        return F.embedding_bag(inverse, leaf, offsets, mode=self.mode, per_sample_weights=per_sample_weights)

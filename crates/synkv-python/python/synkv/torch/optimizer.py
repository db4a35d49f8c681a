"""``DistributedOptimizer``: gradients pushed while backward runs, in Horovod's names.

Two modes, chosen by what it wraps:

* **a torch optimizer** (``torch.optim.SGD``…): the optimizer runs on every worker. Each
  gradient is copied into a bucket as soon as backward has accumulated it; a full bucket
  (``bucket_cap_mb``, default 25 MiB) is pushed and pulled back summed at once, without
  waiting for backward to end, so communication overlaps the rest of backward. Buckets hold
  parameters in reverse order (the order backward produces them); the bucket with the first
  layers gets the highest priority, since the next forward needs them first. ``step()`` waits
  for the buckets, writes the averaged gradients into ``p.grad`` and runs the optimizer.
* **a synkv optimizer** (``synkv.optimizer.Adam(...)``…): the optimizer runs **on the
  servers** (MXNet's ``update_on_kvstore``). Workers push each gradient when backward has
  produced it and ``step()`` pulls the new weights. Sparse gradients (``nn.Embedding(sparse=True)``)
  are pushed as row_sparse, and only their rows pulled back. This is the mode of
  ``dist_async`` training.

Values too large for one message are cut by the store into partitions
(``SYNKV_PARTITION_BYTES``) that travel and are summed independently.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

import synkv
from synkv import optimizer as _synkv_optimizer

from . import _context, _hooks, _keys
from .compression import Compression, Compressor

_instances = iter(range(1 << 62))


def _named(optimizer_params: Iterable[torch.Tensor], named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]]) -> List[Tuple[str, torch.Tensor]]:
    params = [p for p in optimizer_params if p.requires_grad]
    if named_parameters is None:
        return [(f"param.{i}", p) for i, p in enumerate(params)]
    named = list(named_parameters)
    names: Dict[int, str] = {}
    for n, p in named:
        if not isinstance(n, str):
            raise TypeError("named_parameters must be (name, tensor) pairs, e.g. model.named_parameters()")
        names.setdefault(id(p), n)
    if len(set(names.values())) != len(names):
        raise ValueError("named_parameters has duplicate names")
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise ValueError(f"named_parameters lacks {len(missing)} of the optimizer's parameters (e.g. index {missing[0]}); pass model.named_parameters() of the model being optimized")
    return [(names[id(p)], p) for p in params]


def _sparse_embedding_weights(model: torch.nn.Module) -> "set[str]":
    """The names of the weights of ``model``'s sparse embeddings."""
    found = set()
    for prefix, m in model.named_modules():
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
            found.add(f"{prefix}.weight" if prefix else "weight")
    return found


class _Bucket:
    """Parameters whose gradients travel together, as one flat key."""

    def __init__(self, key: str, params: List[Tuple[str, torch.Tensor]], dtype: torch.dtype, priority: int):
        self.key = key
        self.params = params
        self.priority = priority
        self.slices: Dict[int, Tuple[int, int]] = {}
        offset = 0
        for _, p in params:
            self.slices[id(p)] = (offset, p.numel())
            offset += p.numel()
        self.buf = torch.zeros(offset, dtype=dtype)
        self.ready: set = set()
        self.request: Any = None
        self.launched = False

    def view(self, p: torch.Tensor) -> torch.Tensor:
        start, n = self.slices[id(p)]
        return self.buf[start : start + n].view(p.shape)


class _DistributedOptimizer(torch.optim.Optimizer):
    """The worker-side mode (see the module docs); its methods are mixed into a subclass of
    the wrapped optimizer's class, as Horovod does, so schedulers and checkpoints see the
    optimizer they expect."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, bucket_cap_mb):  # type: ignore[no-untyped-def]
        super(self.__class__, self).__init__(params)
        kv = _context.store()
        if kv.type == "dist_async":
            raise ValueError(
                "dist_async applies every push on its own, so gradients cannot be averaged on the workers: "
                "wrap a synkv optimizer instead (DistributedOptimizer(synkv.optimizer.SGD(...), named_parameters=...)), which runs on the servers"
            )
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._kv = kv
        self._compression = compression
        self._passes = int(backward_passes_per_step)
        self._size = kv.num_workers
        self._communicate = not (self._size == 1 and kv.type in ("local", "device"))
        named = _named((p for g in self.param_groups for p in g["params"]), named_parameters)
        self._counts: Dict[int, int] = {id(p): 0 for _, p in named}
        self._synchronized = False
        self._skip_sync = False
        cap = int(float(bucket_cap_mb) * (1 << 20))
        instance = next(_instances)
        # Reverse registration order is about the order backward produces gradients.
        groups: Dict[torch.dtype, List[List[Tuple[str, torch.Tensor]]]] = {}
        fill: Dict[torch.dtype, int] = {}
        for n, p in reversed(named):
            wire = compression.wire_dtype(p.dtype)
            nbytes = p.numel() * p.element_size()
            lists = groups.setdefault(wire, [[]])
            if lists[-1] and fill.get(wire, 0) + nbytes > cap:
                lists.append([])
                fill[wire] = 0
            lists[-1].append((n, p))
            fill[wire] = fill.get(wire, 0) + nbytes
        ordered = [(dtype, members) for dtype, lists in groups.items() for members in lists if members]
        # The bucket of the first layers (filled last) gets the highest priority.
        self._buckets = [
            _Bucket(f"torch/grad/{instance}/{i}", members, dtype, priority=i) for i, (dtype, members) in enumerate(ordered)
        ]
        self._bucket_of = {id(p): b for b in self._buckets for _, p in b.params}
        if self._communicate:
            _context.set_compression(compression.store_params)
            _keys.ensure([b.key for b in self._buckets], [b.buf for b in self._buckets])
        self._hooks = _hooks.after_accumulate([p for _, p in named], self._grad_ready)

    # -- backward -------------------------------------------------------------------------
    def _grad_ready(self, p: torch.Tensor) -> None:
        pid = id(p)
        self._counts[pid] += 1
        if self._counts[pid] < self._passes:
            return
        if self._counts[pid] > self._passes:
            raise RuntimeError(
                f"a gradient was computed {self._counts[pid]} times before step() with backward_passes_per_step={self._passes}; "
                "call step() (or synchronize()) after that many backward passes, or raise backward_passes_per_step"
            )
        bucket = self._bucket_of[pid]
        self._fill(bucket, p)
        if len(bucket.ready) == len(bucket.params):
            self._launch(bucket)

    def _fill(self, bucket: _Bucket, p: torch.Tensor) -> None:
        """Puts ``p``'s gradient into its bucket. When the bucket holds the gradient's dtype,
        ``p.grad`` becomes a view of the bucket (as DDP's ``gradient_as_bucket_view``), so
        later backward passes accumulate straight into it and the averaged result lands in
        ``p.grad`` without copies; ``zero_grad`` keeps the views (it zeroes in place)."""
        view = bucket.view(p)
        with torch.no_grad():
            g = p.grad
            if g is not None and not g.is_sparse and g.data_ptr() == view.data_ptr():
                pass  # already a view: backward accumulated into the bucket
            elif g is None:
                view.zero_()
            else:
                view.copy_(g.to_dense() if g.is_sparse else g)
            if view.dtype == p.dtype and (g is None or not g.is_sparse):
                p.grad = view
        bucket.ready.add(id(p))

    def _launch(self, bucket: _Bucket) -> None:
        bucket.launched = True
        if self._communicate:
            bucket.request = self._kv.pushpull(bucket.key, bucket.buf, out=bucket.buf, priority=bucket.priority, block=False)

    # -- step -----------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Waits for every bucket (pushing the ones backward did not complete) and writes the
        averaged gradients into ``p.grad``."""
        for b in self._buckets:
            if not b.launched:
                for _, p in b.params:
                    if id(p) not in b.ready:
                        self._fill(b, p)
                self._launch(b)
        for b in self._buckets:
            if b.request is not None:
                b.request.wait()
            with torch.no_grad():
                if self._size > 1:
                    b.buf.div_(self._size)
                for _, p in b.params:
                    v = b.view(p)
                    if p.grad is not None and p.grad.data_ptr() == v.data_ptr():
                        continue  # p.grad is the bucket's view: already averaged
                    if p.grad is None or p.grad.is_sparse or p.grad.shape != p.shape:
                        p.grad = torch.empty_like(p)
                    p.grad.copy_(v)  # another dtype on the wire (Compression.fp16)
            b.request, b.launched = None, False
            b.ready.clear()
        for pid in self._counts:
            self._counts[pid] = 0
        self._synchronized = True

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zeroes the gradients in place (``set_to_none`` is ignored: gradients are views of
        the buckets, which must stay)."""
        super(self.__class__, self).zero_grad(set_to_none=False)

    def skip_synchronize(self) -> "_SkipSync":
        """``with optimizer.skip_synchronize(): optimizer.step()`` after calling
        ``synchronize()`` yourself (e.g. to clip the averaged gradients first)."""
        return _SkipSync(self)

    def step(self, closure=None):  # type: ignore[no-untyped-def]
        if not self._skip_sync:
            self.synchronize()
        elif not self._synchronized:
            raise RuntimeError("step() inside skip_synchronize() needs a synchronize() first")
        self._synchronized = False
        return super(self.__class__, self).step(closure)


class _SkipSync:
    def __init__(self, opt: Any):
        self.opt = opt

    def __enter__(self) -> None:
        self.opt._skip_sync = True

    def __exit__(self, *exc: Any) -> None:
        self.opt._skip_sync = False


class ServerOptimizer(torch.optim.Optimizer):
    """The server-side mode (see the module docs): a synkv optimizer runs on the servers.

    ``step()`` waits for this step's gradient pushes, then pulls the new weights into the
    parameters. The torch-side ``param_groups`` exist for ``zero_grad()``; learning rates are
    the synkv optimizer's (``learning_rate``, ``lr_scheduler``). Its state lives on the
    servers: :meth:`save_states` / :meth:`load_states` (or the store's checkpoints) keep it.
    """

    _synkv_server_side = True

    def __init__(
        self,
        server_optimizer: "_synkv_optimizer.Optimizer",
        named_parameters: Iterable[Tuple[str, torch.Tensor]],
        compression: Compressor = Compression.none,
        backward_passes_per_step: int = 1,
        sparse_params: Optional[Iterable[str]] = None,
    ):
        sparse_names = set(sparse_params or ())
        if isinstance(named_parameters, torch.nn.Module):
            sparse_names |= _sparse_embedding_weights(named_parameters)
            named_parameters = named_parameters.named_parameters()
        pairs = [(n, p) for n, p in named_parameters if p.requires_grad]
        unknown = sparse_names - {n for n, _ in pairs}
        if unknown:
            raise ValueError(f"sparse_params names parameters that are not in named_parameters: {sorted(unknown)}")
        if not pairs:
            raise ValueError("ServerOptimizer needs named parameters (model.named_parameters())")
        if len({n for n, _ in pairs}) != len(pairs):
            raise ValueError("named_parameters has duplicate names")
        super().__init__([p for _, p in pairs], {})
        kv = _context.store()
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._kv = kv
        self._passes = int(backward_passes_per_step)
        self._compression = compression
        self._params = pairs
        self._keys = {id(p): f"torch/weight/{n}" for n, p in pairs}
        self._prio = {id(p): len(pairs) - i for i, (_, p) in enumerate(pairs)}
        self._counts: Dict[int, int] = {id(p): 0 for _, p in pairs}
        self._pending: List[Any] = []
        self._pushed: Dict[int, Any] = {}
        self._sparse_rows: Dict[int, torch.Tensor] = {}
        self._warned_dense = False
        sync = kv.type != "dist_async"
        if compression.wire_dtype(torch.float32) != torch.float32:
            raise ValueError("with an optimizer on the servers, weights are kept in their own dtype: use Compression.none, twobit or onebit")
        _context.set_compression(compression.store_params)
        # Row-sparse keys for the sparse embeddings: their gradients travel as rows.
        self._sparse = {id(p) for n, p in pairs if n in sparse_names}
        dense = [(n, p) for n, p in pairs if id(p) not in self._sparse]
        rows = [(n, p) for n, p in pairs if id(p) in self._sparse]
        # init keeps rank 0's values: every worker starts from rank 0's weights.
        _keys.ensure([self._keys[id(p)] for _, p in dense], [p.data for _, p in dense], zeros=False)
        for _, p in rows:
            value = synkv.RowSparseNDArray(p.data.contiguous().numpy(), np.arange(p.shape[0], dtype=np.int64), tuple(p.shape))
            _keys.ensure_values([self._keys[id(p)]], [value], [tuple(p.shape)], p.dtype)
        self._pull_all()
        opt = server_optimizer
        if sync and kv.num_workers > 1:
            # The servers sum a round's pushes; the optimizer sees their mean.
            import copy

            opt = copy.copy(server_optimizer)
            opt.rescale_grad = server_optimizer.rescale_grad / kv.num_workers
        kv.set_optimizer(opt)
        _context._mark_server_optimizer()
        self._hooks = _hooks.after_accumulate([p for _, p in pairs], self._grad_ready)

    def _pull_all(self) -> None:
        for _, p in self._params:
            if id(p) in self._sparse:
                self._pull_rows(p, torch.arange(p.shape[0]))
        self._pull_dense([p for _, p in self._params if id(p) not in self._sparse])

    @torch.no_grad()
    def _pull_dense(self, params: List[torch.Tensor]) -> None:
        """Pulls the weights of dense parameters in one call (into a contiguous buffer for a
        parameter that is not contiguous)."""
        if not params:
            return
        outs = [p.data if p.data.is_contiguous() else torch.empty_like(p.data, memory_format=torch.contiguous_format) for p in params]
        self._kv.pull([self._keys[id(p)] for p in params], out=outs)
        for p, t in zip(params, outs):
            if t is not p.data:
                p.data.copy_(t)

    def _grad_ready(self, p: torch.Tensor) -> None:
        pid = id(p)
        self._counts[pid] += 1
        if self._counts[pid] != self._passes:
            if self._counts[pid] > self._passes:
                raise RuntimeError(f"a gradient was computed {self._counts[pid]} times before step() with backward_passes_per_step={self._passes}")
            return
        self._push(p)

    def _push(self, p: torch.Tensor) -> None:
        pid = id(p)
        g = p.grad
        key = self._keys[pid]
        if pid in self._sparse:
            if g is None:
                rows, data = torch.zeros(0, dtype=torch.int64), torch.zeros((0,) + tuple(p.shape[1:]), dtype=p.dtype)
            elif g.is_sparse:
                g = g.coalesce()
                rows, data = g.indices()[0].to(torch.int64).contiguous(), g.values().contiguous()
            else:
                rows, data = torch.arange(p.shape[0]), g.contiguous()
            value = synkv.RowSparseNDArray(data.numpy(), rows.numpy(), tuple(p.shape))
            self._sparse_rows[pid] = rows
            self._pushed[pid] = value
            self._pending.append(self._kv.push(key, value, priority=self._prio[pid], block=False))
            return
        if g is not None and g.is_sparse:
            if not self._warned_dense:
                warnings.warn(
                    "a sparse gradient was pushed dense: its parameter was not known to be sparse. Pass the model itself "
                    "(named_parameters=model) so sparse embeddings are found, or name them in sparse_params",
                    stacklevel=2,
                )
                self._warned_dense = True
            g = g.to_dense()
        if g is None:
            g = torch.zeros_like(p, memory_format=torch.contiguous_format)
        elif not g.is_contiguous():
            g = g.contiguous()
        self._pushed[pid] = g
        self._pending.append(self._kv.push(key, g, priority=self._prio[pid], block=False))

    def synchronize(self) -> None:
        """Waits for this step's pushes (pushing zeros for parameters without a gradient)."""
        for _, p in self._params:
            if id(p) not in self._pushed:
                self._push(p)
        for r in self._pending:
            r.wait()
        self._pending.clear()

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def]
        loss = closure() if closure is not None else None
        self.synchronize()
        self._pull_dense([p for _, p in self._params if id(p) not in self._sparse])
        for _, p in self._params:
            if id(p) in self._sparse:
                self._pull_rows(p, self._sparse_rows[id(p)])
        self._pushed.clear()
        self._sparse_rows.clear()
        for pid in self._counts:
            self._counts[pid] = 0
        return loss

    @torch.no_grad()
    def _pull_rows(self, p: torch.Tensor, rows: torch.Tensor) -> None:
        """Pulls the rows ``rows`` of a sparse parameter into ``p``."""
        if rows.numel():
            out = synkv.RowSparseNDArray.zeros(tuple(p.shape), dtype=p.data.numpy().dtype)
            self._kv.row_sparse_pull(self._keys[id(p)], out=out, row_ids=rows.numpy())
            p.data[torch.from_numpy(out.indices)] = torch.from_numpy(out.data)

    def pull_rows(self, parameter: torch.Tensor, ids: torch.Tensor) -> None:
        """Refreshes the rows ``ids`` of a sparse embedding's weight from the servers (e.g.
        the rows the next batch uses, which other workers may have changed)."""
        if id(parameter) not in self._sparse:
            raise ValueError("pull_rows takes the weight of a sparse embedding known to this optimizer")
        self._pull_rows(parameter, torch.unique(ids.reshape(-1)).to(torch.int64))

    def save_states(self, fname: str) -> None:
        """Saves the servers' optimizer states (every worker may call it; the file is this
        worker's copy)."""
        self._kv.save_optimizer_states(fname)

    def load_states(self, fname: str) -> None:
        """Loads optimizer states saved by :meth:`save_states`."""
        self._kv.load_optimizer_states(fname)


def DistributedOptimizer(
    optimizer: Any,
    named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None,
    compression: Compressor = Compression.none,
    backward_passes_per_step: int = 1,
    bucket_cap_mb: Optional[float] = None,
    sparse_params: Optional[Iterable[str]] = None,
) -> torch.optim.Optimizer:
    """Wraps ``optimizer`` so that gradients are averaged over the workers (Horovod's and
    BytePS's ``DistributedOptimizer``). A torch optimizer runs on the workers; a synkv
    optimizer (``synkv.optimizer.SGD(...)``) runs on the servers (``named_parameters``
    required). ``bucket_cap_mb`` (default ``SYNKV_TORCH_BUCKET_MB`` or 25) bounds the buckets
    gradients are fused into (worker-side mode). ``named_parameters`` may be the model
    itself: then the weights of its ``nn.Embedding(sparse=True)`` / ``nn.EmbeddingBag(sparse=True)``
    modules are found and, with an optimizer on the servers, kept as row_sparse keys whose
    gradients travel as rows (``sparse_params`` names more). On the workers, sparse gradients
    are averaged dense."""
    if isinstance(optimizer, _synkv_optimizer.Optimizer):
        if named_parameters is None:
            raise ValueError("an optimizer on the servers needs named_parameters=model (or model.named_parameters())")
        params = named_parameters if isinstance(named_parameters, torch.nn.Module) else list(named_parameters)
        return ServerOptimizer(optimizer, params, compression, backward_passes_per_step, sparse_params)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer or a synkv.optimizer.Optimizer, got {type(optimizer).__name__}")
    if isinstance(named_parameters, torch.nn.Module):
        named_parameters = named_parameters.named_parameters()
    if bucket_cap_mb is None:
        bucket_cap_mb = float(os.environ.get("SYNKV_TORCH_BUCKET_MB", "25"))
    if not bucket_cap_mb > 0:
        raise ValueError("bucket_cap_mb must be > 0")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    wrapped = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, bucket_cap_mb)
    wrapped.load_state_dict(optimizer.state_dict())
    return wrapped

"""A ``DistributedDataParallel`` communication hook: DDP's gradient buckets all-reduced
through synkv's servers instead of the process group.

    model = DistributedDataParallel(model)
    model.register_comm_hook(None, synkv.torch.push_pull_hook)          # or fp16_push_pull_hook

The process group DDP needs (``torch.distributed.init_process_group``) still carries DDP's
start-up broadcast; every gradient goes through synkv. The hook starts the bucket's push and
pull and returns a future completed by a helper thread, so backward goes on meanwhile.
Quantized variants: ``push_pull_hook_with(Compression.twobit)``.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Callable, Optional

import torch

from . import _context, _keys
from .compression import Compression, Compressor

_pool_lock = threading.Lock()
_pool: Optional[concurrent.futures.ThreadPoolExecutor] = None


def _waiter() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="synkv-ddp-hook")
        return _pool


def _hook(compression: Compressor) -> Callable[[Any, Any], "torch.futures.Future[torch.Tensor]"]:
    # No annotations: DDP checks them against its own types (and these are strings here).
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        kv = _context.store()
        buf: torch.Tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
        n = kv.num_workers
        fut: "torch.futures.Future[torch.Tensor]" = torch.futures.Future()
        if n == 1 and kv.type in ("local", "device"):
            fut.set_result(buf)
            return fut
        _context.set_compression(compression.store_params)
        wire_dtype = compression.wire_dtype(buf.dtype)
        wire = buf if wire_dtype == buf.dtype else buf.to(wire_dtype)
        # DDP rebuilds its buckets after the first iteration: a key per (index, size, dtype).
        key = f"torch/ddp/{bucket.index()}/{buf.numel()}/{wire.dtype}"
        _keys.ensure([key], [wire])
        request = kv.pushpull(key, wire, out=wire, priority=bucket.index(), block=False)

        def finish() -> None:
            try:
                request.wait()
                if wire is not buf:
                    buf.copy_(wire)
                buf.div_(n)
                fut.set_result(buf)
            except BaseException as e:  # the error reaches backward through the future
                fut.set_exception(e)

        _waiter().submit(finish)
        return fut

    hook.__name__ = f"push_pull_hook[{compression!r}]"
    return hook


def push_pull_hook_with(compression: Compressor) -> Callable[[Any, Any], "torch.futures.Future[torch.Tensor]"]:
    """A DDP communication hook averaging buckets through synkv with ``compression``."""
    return _hook(compression)


#: Buckets averaged through synkv as they are.
push_pull_hook = _hook(Compression.none)
#: Buckets travel as float16.
fp16_push_pull_hook = _hook(Compression.fp16)

"""synkv for PyTorch: a parameter server a torch training loop gets in one line.

Horovod's and BytePS's API, so migrating is renaming an import::

    import synkv.torch as skv

    skv.init()                                   # the job's store (dist_sync under a launcher)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * skv.size())
    opt = skv.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    skv.broadcast_parameters(model.state_dict(), root_rank=0)
    skv.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()          # gradients are pushed while this runs
        opt.step()                               # waits for the averaged gradients

and, what no all-reduce system has:

* the optimizer **on the servers** (``skv.DistributedOptimizer(synkv.optimizer.Adam(...),
  named_parameters=...)``): workers push gradients and pull weights;
* **asynchronous training** (``skv.init("dist_async")`` with a server-side optimizer);
* **embedding tables on the servers** (:class:`SparseEmbedding`, :class:`SparseEmbeddingBag`):
  only the rows a batch uses travel, and the table may exceed a worker's memory;
* a **DDP communication hook** (:func:`push_pull_hook`) for scripts that keep
  ``DistributedDataParallel``.

Tensors are CPU tensors (float32, float16, bfloat16, float64), passed to the store without
copying. Start a job with ``synkv launch -n W -s S -- python train.py``, or with torchrun,
Slurm or mpirun (see ``docs/torch.md``).
"""

from __future__ import annotations

from ._context import has_server_optimizer, init, is_async, is_initialized, local_rank, local_size, rank, shutdown, size, store
from .compression import Compression
from .ddp import fp16_push_pull_hook, push_pull_hook, push_pull_hook_with
from .ops import (
    Handle,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    broadcast,
    broadcast_,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
    poll,
    push_pull,
    push_pull_,
    push_pull_async,
    push_pull_async_,
    synchronize,
)
from .optimizer import DistributedOptimizer, ServerOptimizer
from .sparse import SparseEmbedding, SparseEmbeddingBag

__all__ = [
    "Compression",
    "DistributedOptimizer",
    "Handle",
    "ServerOptimizer",
    "SparseEmbedding",
    "SparseEmbeddingBag",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "broadcast",
    "broadcast_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "fp16_push_pull_hook",
    "has_server_optimizer",
    "init",
    "is_async",
    "is_initialized",
    "local_rank",
    "local_size",
    "poll",
    "push_pull",
    "push_pull_",
    "push_pull_async",
    "push_pull_async_",
    "push_pull_hook",
    "push_pull_hook_with",
    "rank",
    "shutdown",
    "size",
    "store",
    "synchronize",
]

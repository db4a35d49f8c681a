"""Tensor collectives over the store: ``push_pull`` (all-reduce through the servers),
``broadcast``, their asynchronous forms, and broadcasting a model's or an optimizer's state.

``push_pull(t)`` pushes ``t`` from every worker, the servers sum the pushes of a round, and
every worker pulls the sum (divided by ``size()`` with ``average=True``): the result of an
all-reduce. Calls are matched across workers by ``name`` (one is made up from a counter when
none is given, so every worker must then make its calls in the same order).
"""

from __future__ import annotations

import collections.abc
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

import torch

from . import _context, _keys
from .compression import Compression, Compressor


class Handle:
    """An operation in flight (from :func:`push_pull_async`); :func:`synchronize` ends it."""

    def __init__(self, request: Any, result: torch.Tensor, wire: torch.Tensor, divisor: int):
        self._request = request
        self._result = result
        self._wire = wire
        self._divisor = divisor
        self._done = False

    def poll(self) -> bool:
        """Whether the operation has completed (``synchronize`` will not wait)."""
        return self._done or self._request is None or self._request.done()

    def wait(self) -> torch.Tensor:
        """Waits for the operation, then returns its result."""
        if not self._done:
            if self._request is not None:
                self._request.wait()
            if self._wire is not self._result:
                self._result.copy_(self._wire)
            if self._divisor > 1:
                self._result.div_(self._divisor)
            self._done = True
        return self._result


def _check(tensor: torch.Tensor, what: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} takes a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what}: synkv holds CPU tensors today; move the tensor with .cpu() (got one on {tensor.device})")
    if tensor.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"{what}: synkv sums float32, float16, bfloat16 and float64 tensors, got {tensor.dtype}")


def push_pull_async_(
    tensor: torch.Tensor,
    average: bool = True,
    name: Optional[str] = None,
    priority: int = 0,
    compression: Compressor = Compression.none,
) -> Handle:
    """Starts an in-place :func:`push_pull_` and returns at once; :func:`synchronize` ends it.
    Leave ``tensor`` alone until then. A quantizing ``compression`` turns on the store's
    compression, which then applies to every float32 push of the job."""
    _check(tensor, "push_pull")
    kv = _context.store()
    _context.set_compression(compression.store_params)
    name = name if name is not None else _keys.unnamed("push_pull")
    n = kv.num_workers
    wire_dtype = compression.wire_dtype(tensor.dtype)
    if tensor.is_contiguous() and wire_dtype == tensor.dtype:
        wire = tensor
    else:
        wire = tensor.detach().to(dtype=wire_dtype, memory_format=torch.contiguous_format)
    key = f"torch/pp/{name}"
    _keys.ensure([key], [wire])
    if n == 1 and kv.type in ("local", "device"):
        return Handle(None, tensor, wire, 1)
    request = kv.pushpull(key, wire, out=wire, priority=priority, block=False)
    return Handle(request, tensor, wire, n if average else 1)


def push_pull_async(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None, priority: int = 0, compression: Compressor = Compression.none) -> Handle:
    """Starts :func:`push_pull` on a copy of ``tensor`` and returns at once."""
    _check(tensor, "push_pull")
    return push_pull_async_(tensor.detach().clone(memory_format=torch.contiguous_format), average, name, priority, compression)


def push_pull_(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None, priority: int = 0, compression: Compressor = Compression.none) -> torch.Tensor:
    """Replaces ``tensor`` by the sum (``average``: the mean) of every worker's ``tensor``."""
    return push_pull_async_(tensor, average, name, priority, compression).wait()


def push_pull(tensor: torch.Tensor, average: bool = True, name: Optional[str] = None, priority: int = 0, compression: Compressor = Compression.none) -> torch.Tensor:
    """The sum (``average``: the mean) of every worker's ``tensor``, as a new tensor."""
    return push_pull_async(tensor, average, name, priority, compression).wait()


def synchronize(handle: Handle) -> torch.Tensor:
    """Waits for an asynchronous operation and returns its result tensor."""
    return handle.wait()


def poll(handle: Handle) -> bool:
    """Whether an asynchronous operation has completed."""
    return handle.poll()


# Horovod's names.
allreduce = push_pull
allreduce_ = push_pull_
allreduce_async = push_pull_async
allreduce_async_ = push_pull_async_


def _broadcast_many(named: "list[Tuple[str, torch.Tensor]]", root_rank: int) -> None:
    """Overwrites every tensor with ``root_rank``'s, in place."""
    kv = _context.store()
    n = kv.num_workers
    if not 0 <= root_rank < n:
        raise ValueError(f"root_rank {root_rank} is not a rank of this job (0..{n - 1})")
    for name, t in named:
        _check(t, f"broadcast of {name!r}")
    if n == 1 or not named:
        return
    tensors = [t.detach() for _, t in named]
    wires = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    if kv.type == "dist_async" or _context.has_server_optimizer() or _context.compression() is not None:
        # Pushes would be applied one by one (async), through the servers' optimizer, or
        # quantized: fresh keys initialised with rank 0's values (init keeps rank 0's and
        # travels uncompressed), then pulled.
        if root_rank != 0:
            raise ValueError(
                "with dist_async, an optimizer on the servers or gradient compression, broadcast is from rank 0 only "
                "(init keeps rank 0's values); broadcast before turning those on, or use root_rank=0"
            )
        keys = [f"torch/bcast/{name}#{_keys.unnamed('b')}" for name, _ in named]
        _keys.ensure(keys, wires, zeros=False)
        kv.pull(keys, out=wires)
    else:
        # Rank root pushes its values, the others zeros: the round's sum is root's value.
        keys = [f"torch/bcast/{name}" for name, _ in named]
        _keys.ensure(keys, wires)
        values = wires if kv.rank == root_rank else [torch.zeros_like(w) for w in wires]
        kv.pushpull(keys, values, out=wires)
    for t, w in zip(tensors, wires):
        if w is not t:
            t.copy_(w)


def broadcast_(tensor: torch.Tensor, root_rank: int = 0, name: Optional[str] = None) -> torch.Tensor:
    """Overwrites ``tensor`` with ``root_rank``'s, in place; returns it."""
    _broadcast_many([(name if name is not None else _keys.unnamed("broadcast"), tensor)], root_rank)
    return tensor


def broadcast(tensor: torch.Tensor, root_rank: int = 0, name: Optional[str] = None) -> torch.Tensor:
    """``root_rank``'s ``tensor``, as a new tensor."""
    return broadcast_(tensor.detach().clone(), root_rank, name)


def broadcast_parameters(params: Union[Mapping[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]]], root_rank: int = 0) -> None:
    """Overwrites parameters (a ``state_dict()``, or ``named_parameters()``) with
    ``root_rank``'s, in place, in one round trip. Non-float entries (e.g. BatchNorm's
    ``num_batches_tracked``) travel as float64."""
    items = list(params.items()) if isinstance(params, collections.abc.Mapping) else list(params)
    floats, others = [], []
    for name, t in sorted(items, key=lambda kv: kv[0]):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {name!r} is a {type(t).__name__}, not a tensor")
        (floats if t.is_floating_point() else others).append((name, t))
    _broadcast_many([(f"param/{n}", t.data) for n, t in floats], root_rank)
    if others:
        wide = [(f"param/{n}", t.data.to(torch.float64)) for n, t in others]
        _broadcast_many(wide, root_rank)
        for (_, t), (_, w) in zip(others, wide):
            t.data.copy_(w.to(t.dtype))


def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """``root_rank``'s ``obj`` (anything picklable)."""
    import pickle

    name = name if name is not None else _keys.unnamed("broadcast_object")
    data = pickle.dumps(obj) if _context.rank() == root_rank else b""
    length = broadcast_(torch.tensor([float(len(data))], dtype=torch.float64), root_rank, f"obj/{name}/len")
    n = int(length.item())
    # Bytes travel as float16 (0..255 are exact, and so is their sum with zeros).
    buf = torch.zeros(n, dtype=torch.float16)
    if _context.rank() == root_rank:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.float16))
    broadcast_(buf, root_rank, f"obj/{name}/{n}")
    return pickle.loads(bytes(buf.to(torch.uint8).tolist())) if _context.rank() != root_rank else obj


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Overwrites ``optimizer``'s state (momentum buffers, steps, hyper-parameters) with
    ``root_rank``'s. A server-side optimizer's state lives on the servers: nothing to do."""
    if getattr(optimizer, "_synkv_server_side", False):
        return
    state: Dict[str, Any] = optimizer.state_dict()
    # The tensor states travel as tensors; everything else (hyper-parameters, step counts
    # kept as numbers, which states exist) as one pickled object.
    tensors = []
    for pid in sorted(state["state"], key=str):
        for sname in sorted(state["state"][pid]):
            v = state["state"][pid][sname]
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                tensors.append((f"opt/{pid}/{sname}", v))
    layout = broadcast_object(
        {
            "groups": state["param_groups"],
            "numbers": {pid: {s: v for s, v in st.items() if not (isinstance(v, torch.Tensor) and v.is_floating_point())} for pid, st in state["state"].items()},
            "tensors": [(n, tuple(t.shape), str(t.dtype)) for n, t in tensors],
        },
        root_rank,
        "optimizer_state",
    )
    mine = [(n, tuple(t.shape), str(t.dtype)) for n, t in tensors]
    if mine != layout["tensors"]:
        raise ValueError(
            "broadcast_optimizer_state: this worker's optimizer state differs in layout from the root's "
            "(take a step, or none, on every worker before broadcasting)"
        )
    _broadcast_many(tensors, root_rank)
    if _context.rank() != root_rank:
        new_state = optimizer.state_dict()
        new_state["param_groups"] = layout["groups"]
        for pid, numbers in layout["numbers"].items():
            new_state["state"].setdefault(pid, {}).update(numbers)
        optimizer.load_state_dict(new_state)

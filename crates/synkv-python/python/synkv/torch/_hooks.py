"""Running a function right after a parameter's gradient has been accumulated in backward.

torch >= 2.1 has ``Tensor.register_post_accumulate_grad_hook``; before that (torch 1.13), a
post-hook on the parameter's ``AccumulateGrad`` node (reached through ``p.expand_as(p)``) runs
at the same moment, which is what Horovod and BytePS use.
"""

from __future__ import annotations

from typing import Any, Callable, List

import torch


def after_accumulate(params: List[torch.Tensor], fn: Callable[[torch.Tensor], None]) -> List[Any]:
    """Calls ``fn(p)`` each time backward has accumulated ``p.grad``; returns what must be
    kept alive (and removed with :func:`remove`) for the hooks to stay registered."""
    kept: List[Any] = []
    for p in params:
        if hasattr(p, "register_post_accumulate_grad_hook"):
            kept.append(p.register_post_accumulate_grad_hook(lambda t, fn=fn: fn(t)))
        else:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            handle = acc.register_hook(lambda *_, p=p, fn=fn: fn(p))
            kept.append((acc, handle))
    return kept


def remove(kept: List[Any]) -> None:
    """Unregisters hooks made by :func:`after_accumulate`."""
    for k in kept:
        handle = k[1] if isinstance(k, tuple) else k
        handle.remove()

"""Learning-rate schedulers for :mod:`synkv.optimizer`, with ``mxnet.lr_scheduler``'s names.

A scheduler maps the optimizer's update count to a learning rate (spec K6.14); synkv
evaluates it inside the store. The schedulers here only describe it::

    sched = synkv.lr_scheduler.FactorScheduler(step=1000, factor=0.5, warmup_steps=100)
    kv.set_optimizer(synkv.optimizer.SGD(learning_rate=0.1, lr_scheduler=sched))

As in MXNet, the optimizer's ``learning_rate`` is the base rate when it is given; otherwise
the scheduler's ``base_lr`` is.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

__all__ = ["LRScheduler", "FactorScheduler", "MultiFactorScheduler", "PolyScheduler", "CosineScheduler"]


class LRScheduler:
    """Base class: warm-up settings and the base learning rate."""

    def __init__(self, base_lr: float = 0.01, warmup_steps: int = 0, warmup_begin_lr: float = 0, warmup_mode: str = "linear"):
        if warmup_mode not in ("linear", "constant"):
            raise ValueError("warmup_mode must be 'linear' or 'constant'")
        self.base_lr = float(base_lr)
        self.warmup_steps = int(warmup_steps)
        self.warmup_begin_lr = float(warmup_begin_lr)
        self.warmup_mode = warmup_mode

    def _schedule(self) -> Dict[str, Any]:
        raise NotImplementedError

    def to_config(self) -> Dict[str, Any]:
        """The JSON-ready description synkv's optimizer reads (``lr_scheduler`` field)."""
        warmup: Optional[Dict[str, Any]] = None
        if self.warmup_steps > 0:
            warmup = {"steps": self.warmup_steps, "begin_lr": self.warmup_begin_lr, "mode": self.warmup_mode}
        return {"schedule": self._schedule(), "warmup": warmup}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_config()})"


class FactorScheduler(LRScheduler):
    """``lr = base_lr * factor ** k`` after ``k`` periods of ``step`` updates (the first decay
    at update ``step + 1``), never below ``stop_factor_lr``."""

    def __init__(self, step: int, factor: float = 1, stop_factor_lr: float = 1e-8, **kwargs: Any):
        super().__init__(**kwargs)
        self.step, self.factor, self.stop_factor_lr = int(step), float(factor), float(stop_factor_lr)

    def _schedule(self) -> Dict[str, Any]:
        return {"type": "factor", "step": self.step, "factor": self.factor, "stop_factor_lr": self.stop_factor_lr}


class MultiFactorScheduler(LRScheduler):
    """``lr = base_lr * factor ** k`` where ``k`` counts the listed steps passed."""

    def __init__(self, step: Sequence[int], factor: float = 1, **kwargs: Any):
        super().__init__(**kwargs)
        self.step: List[int] = [int(s) for s in step]
        self.factor = float(factor)

    def _schedule(self) -> Dict[str, Any]:
        return {"type": "multi_factor", "steps": self.step, "factor": self.factor}


class PolyScheduler(LRScheduler):
    """Polynomial decay from ``base_lr`` to ``final_lr`` at ``max_update``."""

    def __init__(self, max_update: int, base_lr: float = 0.01, pwr: float = 2, final_lr: float = 0, **kwargs: Any):
        super().__init__(base_lr=base_lr, **kwargs)
        self.max_update, self.pwr, self.final_lr = int(max_update), float(pwr), float(final_lr)

    def _schedule(self) -> Dict[str, Any]:
        return {"type": "poly", "max_update": self.max_update, "pwr": self.pwr, "final_lr": self.final_lr}


class CosineScheduler(LRScheduler):
    """Cosine decay from ``base_lr`` to ``final_lr`` at ``max_update``."""

    def __init__(self, max_update: int, base_lr: float = 0.01, final_lr: float = 0, **kwargs: Any):
        super().__init__(base_lr=base_lr, **kwargs)
        self.max_update, self.final_lr = int(max_update), float(final_lr)

    def _schedule(self) -> Dict[str, Any]:
        return {"type": "cosine", "max_update": self.max_update, "final_lr": self.final_lr}

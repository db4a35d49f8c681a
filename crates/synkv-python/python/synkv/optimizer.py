"""Optimizers for :meth:`synkv.KVStore.set_optimizer`, with ``mxnet.optimizer``'s names.

Each class describes an optimizer — its hyper-parameters, under MXNet 1.9.1's names and
defaults — and serialises to the JSON that synkv's Rust optimizer reads; the arithmetic runs
inside the store (MXNet 1.9.1's update rules, see ``docs/optimizers.md``)::

    kv.set_optimizer(synkv.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-4))
    kv.set_optimizer(synkv.optimizer.create("adam", learning_rate=1e-3))

Per-key multipliers use ``set_lr_mult`` / ``set_wd_mult`` with the store's keys. MXNet's
``param_idx2name``, ``sym`` and ``param_dict`` arguments are not supported.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Type, Union

from .lr_scheduler import LRScheduler

__all__ = [
    "Optimizer",
    "SGD",
    "NAG",
    "Signum",
    "Adam",
    "AdamW",
    "LAMB",
    "AdaGrad",
    "RMSProp",
    "AdaDelta",
    "Ftrl",
    "Test",
    "create",
    "register",
]

_REGISTRY: Dict[str, Type["Optimizer"]] = {}


def register(cls: Type["Optimizer"]) -> Type["Optimizer"]:
    """Registers an optimizer class under its lower-cased name (for :func:`create`)."""
    _REGISTRY[cls.__name__.lower()] = cls
    return cls


def create(name: str, **kwargs: Any) -> "Optimizer":
    """Creates an optimizer by (case-insensitive) name, e.g. ``create("sgd", momentum=0.9)``."""
    try:
        cls = _REGISTRY[name.lower()]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None
    return cls(**kwargs)


class Optimizer:
    """The hyper-parameters every optimizer shares (``mxnet.optimizer.Optimizer``)."""

    #: The optimizer's name in synkv's JSON.
    name = ""

    def __init__(
        self,
        rescale_grad: float = 1.0,
        wd: float = 0.0,
        clip_gradient: Optional[float] = None,
        learning_rate: Optional[float] = None,
        lr_scheduler: Optional[LRScheduler] = None,
        begin_num_update: int = 0,
        multi_precision: bool = False,
    ):
        self.rescale_grad = float(rescale_grad)
        self.wd = float(wd)
        self.clip_gradient = clip_gradient
        self.lr_scheduler = lr_scheduler
        if lr_scheduler is not None and learning_rate is not None:
            lr_scheduler.base_lr = float(learning_rate)  # MXNet: the optimizer's rate wins
        self.lr = learning_rate
        self.begin_num_update = int(begin_num_update)
        self.multi_precision = bool(multi_precision)
        self.lr_mult: Dict[str, float] = {}
        self.wd_mult: Dict[str, float] = {}

    def _params(self) -> Dict[str, Any]:
        """This optimizer's own hyper-parameters, under their JSON names."""
        return {}

    @property
    def learning_rate(self) -> Optional[float]:
        """The base learning rate (``None``: the optimizer's default)."""
        if self.lr is None and self.lr_scheduler is not None:
            return self.lr_scheduler.base_lr
        return self.lr

    def set_learning_rate(self, lr: float) -> None:
        """Sets the base learning rate."""
        self.lr = float(lr)
        if self.lr_scheduler is not None:
            self.lr_scheduler.base_lr = self.lr

    def set_lr_mult(self, args_lr_mult: Mapping[Union[int, str], float]) -> None:
        """Per-key learning-rate multipliers (keys as given to the store)."""
        self.lr_mult = {str(k): float(v) for k, v in args_lr_mult.items()}

    def set_wd_mult(self, args_wd_mult: Mapping[Union[int, str], float]) -> None:
        """Per-key weight-decay multipliers (keys as given to the store)."""
        self.wd_mult = {str(k): float(v) for k, v in args_wd_mult.items()}

    def to_config(self) -> Dict[str, Any]:
        """The JSON-ready description synkv's optimizer reads."""
        clip = self.clip_gradient
        # MXNet passes clip_gradient to its kernels only when it is truthy; < 0 means off too.
        clip = float(clip) if clip and clip > 0 else None
        lr = self.learning_rate
        common = {
            "learning_rate": None if lr is None else float(lr),
            "wd": self.wd,
            "rescale_grad": self.rescale_grad,
            "clip_gradient": clip,
            "lr_mult": dict(self.lr_mult),
            "wd_mult": dict(self.wd_mult),
            "begin_num_update": self.begin_num_update,
            "multi_precision": self.multi_precision,
            "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.to_config(),
        }
        return {"name": self.name, **self._params(), "common": common}

    def to_json(self) -> str:
        """:meth:`to_config` as a JSON string (what ``set_optimizer`` sends to the store)."""
        return json.dumps(self.to_config())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_json()})"


@register
class SGD(Optimizer):
    """SGD with optional momentum: ``m = momentum*m - lr*(clip(rescale_grad*g) + wd*w)``, ``w += m``."""

    name = "sgd"

    def __init__(self, momentum: float = 0.0, lazy_update: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.momentum, self.lazy_update = float(momentum), bool(lazy_update)

    def _params(self) -> Dict[str, Any]:
        return {"momentum": self.momentum, "lazy_update": self.lazy_update}


@register
class NAG(Optimizer):
    """Nesterov accelerated gradient."""

    name = "nag"

    def __init__(self, momentum: float = 0.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.momentum = float(momentum)

    def _params(self) -> Dict[str, Any]:
        return {"momentum": self.momentum}


@register
class Signum(Optimizer):
    """Signum (momentum 0: signSGD), with decoupled weight decay ``wd_lh``."""

    name = "signum"

    def __init__(self, learning_rate: float = 0.01, momentum: float = 0.9, wd_lh: float = 0.0, **kwargs: Any):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.momentum, self.wd_lh = float(momentum), float(wd_lh)

    def _params(self) -> Dict[str, Any]:
        return {"momentum": self.momentum, "wd_lh": self.wd_lh}


@register
class Adam(Optimizer):
    """Adam with the bias-corrected learning rate."""

    name = "adam"

    def __init__(
        self,
        learning_rate: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        lazy_update: bool = True,
        **kwargs: Any,
    ):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon, self.lazy_update = float(beta1), float(beta2), float(epsilon), bool(lazy_update)

    def _params(self) -> Dict[str, Any]:
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon, "lazy_update": self.lazy_update}


@register
class AdamW(Optimizer):
    """Adam with decoupled weight decay (MXNet 2.0's ``AdamW``)."""

    name = "adamw"

    def __init__(
        self,
        learning_rate: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-6,
        correct_bias: bool = True,
        **kwargs: Any,
    ):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon, self.correct_bias = float(beta1), float(beta2), float(epsilon), bool(correct_bias)

    def _params(self) -> Dict[str, Any]:
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon, "correct_bias": self.correct_bias}


@register
class LAMB(Optimizer):
    """LAMB (layer-wise adaptive moments)."""

    name = "lamb"

    def __init__(
        self,
        learning_rate: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-6,
        lower_bound: Optional[float] = None,
        upper_bound: Optional[float] = None,
        bias_correction: bool = True,
        **kwargs: Any,
    ):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        self.lower_bound, self.upper_bound, self.bias_correction = lower_bound, upper_bound, bool(bias_correction)

    def _params(self) -> Dict[str, Any]:
        return {
            "beta1": self.beta1,
            "beta2": self.beta2,
            "epsilon": self.epsilon,
            "lower_bound": self.lower_bound,
            "upper_bound": self.upper_bound,
            "bias_correction": self.bias_correction,
        }


@register
class AdaGrad(Optimizer):
    """AdaGrad (MXNet calls the epsilon ``eps``)."""

    name = "adagrad"

    def __init__(self, eps: float = 1e-7, lazy_update: bool = True, **kwargs: Any):
        super().__init__(**kwargs)
        self.eps, self.lazy_update = float(eps), bool(lazy_update)

    def _params(self) -> Dict[str, Any]:
        return {"epsilon": self.eps, "lazy_update": self.lazy_update}


@register
class RMSProp(Optimizer):
    """RMSProp (Tieleman & Hinton), or Graves' centered version."""

    name = "rmsprop"

    def __init__(
        self,
        learning_rate: float = 0.001,
        gamma1: float = 0.9,
        gamma2: float = 0.9,
        epsilon: float = 1e-8,
        centered: bool = False,
        clip_weights: Optional[float] = None,
        **kwargs: Any,
    ):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.gamma1, self.gamma2, self.epsilon = float(gamma1), float(gamma2), float(epsilon)
        self.centered, self.clip_weights = bool(centered), clip_weights

    def _params(self) -> Dict[str, Any]:
        clip = float(self.clip_weights) if self.clip_weights and self.clip_weights > 0 else None
        return {"gamma1": self.gamma1, "gamma2": self.gamma2, "epsilon": self.epsilon, "centered": self.centered, "clip_weights": clip}


@register
class AdaDelta(Optimizer):
    """AdaDelta (the learning rate is not used)."""

    name = "adadelta"

    def __init__(self, rho: float = 0.9, epsilon: float = 1e-5, **kwargs: Any):
        super().__init__(**kwargs)
        self.rho, self.epsilon = float(rho), float(epsilon)

    def _params(self) -> Dict[str, Any]:
        return {"rho": self.rho, "epsilon": self.epsilon}


@register
class Ftrl(Optimizer):
    """FTRL-proximal."""

    name = "ftrl"

    def __init__(self, lamda1: float = 0.01, learning_rate: float = 0.1, beta: float = 1, lazy_update: bool = True, **kwargs: Any):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.lamda1, self.beta, self.lazy_update = float(lamda1), float(beta), bool(lazy_update)

    def _params(self) -> Dict[str, Any]:
        return {"lamda1": self.lamda1, "beta": self.beta, "lazy_update": self.lazy_update}


@register
class Test(Optimizer):
    """The kvstore test optimizer (MXNet 1.x): ``w += rescale_grad * g``."""

    name = "test"

"""Gradient compression for :mod:`synkv.torch`, in Horovod's and BytePS's names.

``Compression.none`` sends gradients as they are; ``Compression.fp16`` casts float32
gradients to float16 on the worker for the trip (halving the bytes) and back after;
``Compression.twobit`` and ``Compression.onebit`` are synkv's quantizers with error feedback
(MXNet's 2-bit and 1-bit compression): the worker keeps the quantization error and adds it to
the next gradient, so nothing is lost over steps. Call a quantizer to change its threshold:
``Compression.twobit(threshold=1.0)``. Quantizers act on ``dist_*`` stores (a ``local`` store
moves nothing, so it ignores them).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch


class Compressor:
    """How gradients travel. ``wire_dtype(dtype)`` is the dtype they are pushed as;
    ``store_params`` is what ``KVStore.set_gradient_compression`` gets (``None``: nothing)."""

    name = "none"

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype

    @property
    def store_params(self) -> Optional[Dict[str, Any]]:
        return None

    def __repr__(self) -> str:
        return f"Compression.{self.name}"


class NoneCompressor(Compressor):
    """Gradients travel in their own dtype."""


class FP16Compressor(Compressor):
    """Float32/float64 gradients travel as float16 (others as they are)."""

    name = "fp16"

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float16 if dtype in (torch.float32, torch.float64) else dtype


class QuantizingCompressor(Compressor):
    """synkv's 2-bit or 1-bit quantization with error feedback (float32 gradients)."""

    def __init__(self, kind: str, threshold: float):
        self.kind = kind
        self.threshold = float(threshold)
        self.name = "twobit" if kind == "2bit" else "onebit"

    def __call__(self, threshold: float) -> "QuantizingCompressor":
        """The same quantizer with another threshold."""
        return QuantizingCompressor(self.kind, threshold)

    @property
    def store_params(self) -> Optional[Dict[str, Any]]:
        return {"type": self.kind, "threshold": self.threshold}

    def __repr__(self) -> str:
        return f"Compression.{self.name}(threshold={self.threshold})"


class Compression:
    """The compression choices (``compression=synkv.torch.Compression.fp16``)."""

    none: Compressor = NoneCompressor()
    fp16: Compressor = FP16Compressor()
    twobit: QuantizingCompressor = QuantizingCompressor("2bit", 0.5)
    onebit: QuantizingCompressor = QuantizingCompressor("1bit", 0.0)

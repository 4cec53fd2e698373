"""Encoders by model family, looked up through a registry.

Built-in families are imported only when first used, so that importing bulkembed does not
import torch. Tests and plugins add families with `register_encoder`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bulkembed.contracts import Embeddings, SparseVector, TokenBatch
from bulkembed.encoders.base import Embedder, Encoder, VectorSizes
from bulkembed.encoders.registry import build_encoder, register_encoder, start_encoder

if TYPE_CHECKING:
    from bulkembed.encoders.transfer import DeviceInputs, DeviceOutputs

__all__ = [
    "DeviceInputs",
    "DeviceOutputs",
    "Embedder",
    "Embeddings",
    "Encoder",
    "SparseVector",
    "TokenBatch",
    "VectorSizes",
    "build_encoder",
    "register_encoder",
    "start_encoder",
]


def __getattr__(name: str) -> Any:
    """The tensor types, imported (with torch) when first asked for."""
    if name in ("DeviceInputs", "DeviceOutputs"):
        from bulkembed.encoders import transfer

        return getattr(transfer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

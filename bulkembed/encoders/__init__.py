"""Encoders by model family, looked up through a registry.

Built-in families are imported only when first used, so that importing bulkembed does not
import torch. Tests and plugins add families with `register_encoder`.
"""

from __future__ import annotations

from bulkembed.contracts import Embeddings, SparseVector, TokenBatch
from bulkembed.encoders.base import DeviceInputs, DeviceOutputs, Embedder, Encoder, VectorSizes
from bulkembed.encoders.registry import build_encoder, register_encoder, start_encoder

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

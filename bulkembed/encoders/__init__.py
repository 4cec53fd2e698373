"""Encoders by model family, looked up through a registry.

Built-in families are imported only when first used, so that importing bulkembed does not
import torch. Tests and plugins add families with `register_encoder`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from bulkembed.contracts import Embeddings, SparseVector, TokenBatch
from bulkembed.encoders.base import Embedder, Encoder
from bulkembed.errors import ModelError

if TYPE_CHECKING:
    import torch

    from bulkembed.model_spec import ModelSpec

__all__ = [
    "Embedder",
    "Embeddings",
    "Encoder",
    "SparseVector",
    "TokenBatch",
    "build_encoder",
    "register_encoder",
]

_BUILT_IN = {
    "dense": "bulkembed.encoders.dense:DenseEncoder",
    "bge-m3": "bulkembed.encoders.bge_m3:BGEM3Encoder",
    "splade": "bulkembed.encoders.splade:SpladeEncoder",
    "colbert": "bulkembed.encoders.colbert:ColbertEncoder",
}
_REGISTRY: dict[str, type[Encoder]] = {}


def register_encoder(family: str, encoder: type[Encoder]) -> None:
    """Make `family` (as named in recipes) build `encoder`."""
    _REGISTRY[family] = encoder


def _lookup(family: str) -> type[Encoder]:
    if family not in _REGISTRY and family in _BUILT_IN:
        module, name = _BUILT_IN[family].split(":")
        register_encoder(family, getattr(importlib.import_module(module), name))
    if family not in _REGISTRY:
        known = ", ".join(sorted(set(_BUILT_IN) | set(_REGISTRY)))
        raise ModelError(f"unknown model family '{family}' (known: {known})")
    return _REGISTRY[family]


def build_encoder(spec: ModelSpec, device: str, dtype: torch.dtype) -> Encoder:
    """The encoder for `spec.family`, loaded on `device`."""
    return _lookup(spec.family)(spec, device, dtype)

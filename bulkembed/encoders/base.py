"""The encoder interface: a flat batch of token ids in, embeddings out.

An encoder implements one method, `embed`. The base class holds the shared plumbing: the
device and dtype, and turning a flat batch into padded tensors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

    from bulkembed.model_spec import ModelSpec


@dataclass(frozen=True, slots=True)
class TokenBatch:
    """Token ids of several documents laid end to end, with each document's length."""

    token_ids: np.ndarray
    lengths: np.ndarray

    @classmethod
    def from_sequences(cls, sequences: list[np.ndarray]) -> TokenBatch:
        lengths = np.array([len(s) for s in sequences], dtype=np.int32)
        flat = np.concatenate(sequences) if sequences else np.empty(0, np.int32)
        return cls(flat.astype(np.int32, copy=False), lengths)


@dataclass(frozen=True, slots=True)
class Embeddings:
    """What an encoder returns for a batch, one row per document, in batch order."""

    dense: np.ndarray | None = None

    def __len__(self) -> int:
        return 0 if self.dense is None else len(self.dense)


class Encoder(ABC):
    """Embeds token batches on one device."""

    family: str = ""

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        self.spec = spec
        self.device = device
        self.dtype = dtype

    @property
    @abstractmethod
    def dim(self) -> int:
        """Size of the dense vectors."""

    @abstractmethod
    def embed(self, batch: TokenBatch) -> Embeddings:
        """Embeddings for every document of `batch`, in batch order."""

    def padded(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """`input_ids` and `attention_mask` on the device, padded on the right to the longest."""
        import torch

        lengths = torch.from_numpy(batch.lengths.astype(np.int64))
        longest = int(lengths.max()) if len(lengths) else 0
        positions = torch.arange(longest)
        mask = positions.unsqueeze(0) < lengths.unsqueeze(1)
        input_ids = torch.full((len(lengths), longest), self.spec.pad_token_id, dtype=torch.long)
        input_ids[mask] = torch.from_numpy(batch.token_ids.astype(np.int64))
        return input_ids.to(self.device), mask.to(self.device, torch.long)

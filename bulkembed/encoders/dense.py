"""Dense embeddings from a `transformers.AutoModel`: pooled, optionally L2-normalized."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from bulkembed.config import Pooling
from bulkembed.encoders.base import Encoder
from bulkembed.encoders.pooling import pool
from bulkembed.encoders.transfer import DeviceInputs, DeviceOutputs

if TYPE_CHECKING:
    from bulkembed.models.model_spec import ModelSpec


class DenseEncoder(Encoder):
    """One vector per document: the encoder's last hidden state, pooled."""

    runs_flat = True

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        super().__init__(spec, device, dtype)
        self.model = self.load_transformer()

    @property
    def dense_dim(self) -> int:
        return int(self.model.config.hidden_size)

    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        tokens = inputs.hidden_states(self.model)
        vectors = pool(tokens, inputs.sequences, self.spec.pooling or Pooling.CLS)
        if self.spec.normalize:
            vectors = F.normalize(vectors, p=2, dim=1)
        return DeviceOutputs(dense=vectors)

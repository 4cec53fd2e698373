"""SPLADE: a sparse vector over the vocabulary from a masked-language model's logits.

weight(term) = max over the document's tokens of log(1 + relu(logit(token, term))).

The logits of a batch are [documents, tokens, vocabulary] floats: 30522 × 512 × 4 bytes is
62 MB per document. The batch therefore runs in slices small enough that one slice's logits
stay under `LOGITS_BYTES`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from bulkembed.encoders.base import Encoder
from bulkembed.encoders.sparse import keep_top_k, splade_pool
from bulkembed.encoders.transfer import DeviceInputs, DeviceOutputs

if TYPE_CHECKING:
    from bulkembed.models.model_spec import ModelSpec

LOGITS_BYTES = 512 * 1024 * 1024


class SpladeEncoder(Encoder):
    """Sparse vectors from an `AutoModelForMaskedLM` checkpoint, on padded batches."""

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        super().__init__(spec, device, dtype)
        self.model = model = self.load_transformer(masked_lm=True)
        self.vocabulary = int(model.config.vocab_size)

    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        input_ids, attention_mask = inputs.input_ids, inputs.attention_mask
        assert attention_mask is not None
        per_document = input_ids.shape[1] * self.vocabulary * 4
        step = max(1, LOGITS_BYTES // max(per_document, 1))
        pooled = []
        for start in range(0, len(input_ids), step):
            ids, mask = input_ids[start : start + step], attention_mask[start : start + step]
            logits = self.model(input_ids=ids, attention_mask=mask).logits
            pooled.append(splade_pool(logits, mask))
        weights = torch.cat(pooled) if pooled else torch.empty(0, self.vocabulary)
        kept = keep_top_k(weights, self.spec.sparse_top_k)
        return DeviceOutputs(sparse_weights=kept, reduced_from=(weights,))

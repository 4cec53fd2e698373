"""BGE-M3: dense, sparse (lexical weights) and multi-vector (ColBERT) outputs from one pass.

The model folder holds an XLM-RoBERTa encoder plus two heads saved as state dicts:
`sparse_linear.pt` (hidden -> 1) and `colbert_linear.pt` (hidden -> d).

- dense: the first token's hidden state, L2-normalized;
- sparse: `relu(sparse_linear(h))` per token; the ids of the cls, eos, pad and unk tokens
  are dropped, a repeated id keeps its largest weight, and only weights > 0 are kept;
- multivector: `colbert_linear(h)` for every real token but the first, L2-normalized.

Heads whose output was not asked for are not run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from bulkembed.encoders.backend import load_state
from bulkembed.encoders.base import Encoder
from bulkembed.encoders.pooling import cls_pool
from bulkembed.encoders.sparse import max_weight_per_id
from bulkembed.encoders.transfer import DeviceInputs, DeviceOutputs
from bulkembed.errors import ModelError

if TYPE_CHECKING:
    from bulkembed.models.model_spec import ModelSpec


def _load_head(spec: ModelSpec, filename: str, hidden: int, dtype: torch.dtype) -> torch.nn.Linear:
    from bulkembed.models.model_files import model_file

    path = model_file(spec.source, spec.revision, filename)
    if path is None:
        raise ModelError(f"{spec.source} has no {filename}: is it a BGE-M3 model folder?")
    state = load_state(path)
    out_features, in_features = state["weight"].shape
    if in_features != hidden:
        raise ModelError(f"{path} expects hidden size {in_features}, the model has {hidden}")
    head = torch.nn.Linear(in_features, out_features, dtype=dtype)
    head.load_state_dict(state)
    return head


class BGEM3Encoder(Encoder):
    """The three BGE-M3 outputs from one forward pass of the encoder."""

    runs_flat = True

    def __init__(self, spec: ModelSpec, device: str, dtype: torch.dtype) -> None:
        super().__init__(spec, device, dtype)
        self.model = model = self.load_transformer()
        hidden = int(model.config.hidden_size)
        self.sparse_head = None
        self.colbert_head = None
        if "sparse" in self.outputs:
            self.sparse_head = _load_head(spec, "sparse_linear.pt", hidden, self.weights_dtype).to(
                device
            )
        if "multivector" in self.outputs:
            self.colbert_head = _load_head(
                spec, "colbert_linear.pt", hidden, self.weights_dtype
            ).to(device)
        self.excluded = torch.tensor(spec.special_token_ids, dtype=torch.long, device=device)

    @property
    def dense_dim(self) -> int | None:
        return int(self.model.config.hidden_size) if "dense" in self.outputs else None

    @property
    def multivector_dim(self) -> int | None:
        return None if self.colbert_head is None else self.colbert_head.out_features

    def embed(self, inputs: DeviceInputs) -> DeviceOutputs:
        tokens = inputs.hidden_states(self.model)
        sequences = inputs.sequences
        outputs = DeviceOutputs()
        if "dense" in self.outputs:
            outputs.dense = F.normalize(cls_pool(tokens, sequences), dim=-1)
        if self.sparse_head is not None:
            weights = torch.relu(self.sparse_head(tokens)).squeeze(-1)
            token_ids = inputs.token_ids
            counted = ~torch.isin(token_ids, self.excluded)
            documents = sequences.token_documents
            top_k = self.spec.sparse_top_k
            found = max_weight_per_id(weights, token_ids, documents, counted, top_k)
            outputs.sparse_documents, outputs.sparse_ids, outputs.sparse_weights = found
            outputs.reduced_from = (torch.where(counted, weights, 0.0),)
        if self.colbert_head is not None:
            vectors = F.normalize(self.colbert_head(tokens).float(), dim=-1)
            outputs.multivector = vectors.to(self.multivector_dtype)
            # Every token but each document's first.
            keep = np.ones(len(inputs.batch.token_ids), dtype=bool)
            lengths = inputs.batch.lengths
            keep[(np.cumsum(lengths) - lengths)[lengths > 0]] = False
            outputs.multivector_keep = keep
        return outputs

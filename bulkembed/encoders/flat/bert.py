"""The BERT family on flat batches (unpadded): the tokens of a batch laid end to end.

A padded batch of documents of 500 and 20 tokens computes 1,000 token positions; laid end
to end it computes 520. Every layer but attention works on each token alone, so it runs
on [tokens, hidden] with no padding; attention runs within each document over
`cu_seqlens` (`varlen.varlen_attention`). Position ids restart at each document.

`FlatTransformer` is built from a loaded Hugging Face `BertModel`, `RobertaModel` or
`XLMRobertaModel` and uses its weights: the query, key and value projections of each layer
become one fused projection (one matrix multiply instead of three); the embeddings, layer
norms and feed-forward layers are the model's own modules. It computes what the model does
in eval mode, without dropout, for `token_type_ids` all 0 (what bulkembed passes).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bulkembed.encoders.flat.fused import fused_projection
from bulkembed.encoders.flat.registry import FlatFamily
from bulkembed.encoders.varlen import Sequences, varlen_attention

# RoBERTa and XLM-RoBERTa number positions from the padding id + 1, BERT from 0.
_POSITIONS_AFTER_PADDING = frozenset({"roberta", "xlm-roberta"})


def _support(model: Any) -> str | None:
    """Why a model of the BERT family cannot run flat; None if it can."""
    config = model.config
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return f"its position embeddings are {config.position_embedding_type}, not absolute"
    if getattr(config, "chunk_size_feed_forward", 0):
        return "its feed-forward layers run in chunks"
    if not hasattr(model, "embeddings") or not hasattr(model, "encoder"):
        return "it is not a bare encoder model"
    return None


class FlatLayer(nn.Module):
    """One transformer layer over [tokens, hidden]: fused QKV projection, attention within
    each document, output projection, residual and layer norm; then the feed-forward
    block, residual and layer norm (post-norm, as BERT)."""

    def __init__(self, layer: Any, heads: int, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        attention = layer.attention.self
        parts = (attention.query, attention.key, attention.value)
        width = parts[0].out_features
        self.heads, self.head_size = heads, width // heads
        self.qkv = fused_projection(parts)
        self.attention_output = layer.attention.output.dense
        self.attention_norm = layer.attention.output.LayerNorm
        self.intermediate = layer.intermediate.dense
        self.activation = layer.intermediate.intermediate_act_fn
        self.output = layer.output.dense
        self.output_norm = layer.output.LayerNorm

    def forward(self, hidden: torch.Tensor, sequences: Sequences) -> torch.Tensor:
        tokens, width = hidden.shape
        projected = self.qkv(hidden).view(tokens, 3, self.heads, self.head_size)
        query, key, value = projected.unbind(1)
        context = varlen_attention(query, key, value, sequences, self.causal)
        context = context.reshape(tokens, width)
        hidden = self.attention_norm(self.attention_output(context) + hidden)
        expanded = self.activation(self.intermediate(hidden))
        return self.output_norm(self.output(expanded) + hidden)


class FlatTransformer(nn.Module):
    """A BERT-family encoder over a flat batch: `model(input_ids, sequences)` with
    `input_ids` [tokens] gives the last hidden state [tokens, hidden]."""

    def __init__(self, model: Any, causal: bool = False) -> None:
        super().__init__()
        self.config = model.config
        embeddings = model.embeddings
        self.word_embeddings = embeddings.word_embeddings
        self.position_embeddings = embeddings.position_embeddings
        self.embedding_norm = embeddings.LayerNorm
        # Token type 0 for every token: one row, added as the model adds it.
        self.register_buffer(
            "token_type", embeddings.token_type_embeddings.weight[0].detach().clone()
        )
        self.padding_id: int | None = None
        if self.config.model_type in _POSITIONS_AFTER_PADDING:
            self.padding_id = int(self.config.pad_token_id)
        heads = int(self.config.num_attention_heads)
        self.layers = nn.ModuleList(
            FlatLayer(layer, heads, causal) for layer in model.encoder.layer
        )

    def positions(self, input_ids: torch.Tensor, sequences: Sequences) -> torch.Tensor:
        """Each token's position id: its place in its document, counted from 0 (BERT), or
        as RoBERTa counts: from the padding id + 1, over the tokens that are not padding,
        a padding id itself taking the padding id's position."""
        if self.padding_id is None:
            return sequences.positions()
        documents = sequences.token_documents
        starts = sequences.cu_seqlens[:-1].long()
        counted = (input_ids != self.padding_id).long()
        running = counted.cumsum(0)
        before = (running - counted)[starts.clamp(max=len(input_ids) - 1)]
        return (running - before[documents]) * counted + self.padding_id

    def forward(self, input_ids: torch.Tensor, sequences: Sequences) -> torch.Tensor:
        if not len(input_ids):
            return self.word_embeddings(input_ids)
        embedded = self.word_embeddings(input_ids) + self.token_type
        embedded = embedded + self.position_embeddings(self.positions(input_ids, sequences))
        hidden = self.embedding_norm(embedded)
        for layer in self.layers:
            hidden = layer(hidden, sequences)
        return hidden


BERT_FAMILY = FlatFamily(
    "bert", frozenset({"bert", "roberta", "xlm-roberta"}), FlatTransformer, support=_support
)

"""The NomicBERT family on flat batches (unpadded): the tokens of a batch laid end to end.

NomicBERT (transformers' `NomicBertModel`, nomic-embed-text) is a post-norm encoder like
BERT, without position embeddings: its layers turn queries and keys by rotary embeddings,
and its feed-forward block is gated (SwiGLU: `down(silu(gate(x)) * up(x))`), with no biases
anywhere but in the layer norms. Every layer but attention works on each token alone, so it
runs on [tokens, hidden] with no padding; attention runs within each document over
`cu_seqlens` (`varlen.varlen_attention`), and the rotary angles are those of each token's
place in its document (position ids restart at each document).

`FlatNomicBert` is built from a loaded Hugging Face `NomicBertModel` and uses its weights:
the query, key and value projections of each layer become one fused projection (one matrix
multiply instead of three); the embeddings (token embeddings, token type 0 and norm), the
rotary embedding module (given the position ids as [1, tokens], so that a rope scaling is
computed by the model's own code), its `apply_rotary_pos_emb`, the output projections, norms
and feed-forward blocks are the model's own. It computes what the model does in eval mode,
without dropout, for `token_type_ids` all 0 (what bulkembed passes). A rope scaling that
depends on the sequence length ("dynamic", "longrope") sees the longest document of the
batch, as the model run padded to that document sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bulkembed.encoders.flat.fused import fused_projection
from bulkembed.encoders.flat.registry import FlatFamily
from bulkembed.encoders.varlen import Sequences, varlen_attention

# Rotary cosines and sines, each [tokens, head size].
Rotary = tuple[torch.Tensor, torch.Tensor]
# Queries and keys turned by rotary cosines and sines: transformers' `apply_rotary_pos_emb`.
Rotate = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _support(model: Any) -> str | None:
    """Why a NomicBERT model cannot run flat; None if it can."""
    parts = ("embeddings", "layers", "rotary_emb")
    if not all(hasattr(model, part) for part in parts):
        return "it is not transformers' bare NomicBertModel (embeddings, layers, rotary_emb)"
    return None


class FlatNomicBertLayer(nn.Module):
    """One NomicBERT layer over [tokens, hidden]: fused QKV projection, rotary embeddings,
    attention within each document, output projection, residual and layer norm; then the
    gated feed-forward block, residual and layer norm (post-norm)."""

    def __init__(self, layer: Any, heads: int, rotate: Rotate, causal: bool) -> None:
        super().__init__()
        self.causal, self.rotate = causal, rotate
        attention = layer.self_attn
        parts = (attention.q_proj, attention.k_proj, attention.v_proj)
        self.heads, self.head_size = heads, int(attention.head_dim)
        self.qkv = fused_projection(parts)
        self.attention_output = attention.o_proj
        self.attention_norm = layer.post_attention_layernorm
        self.mlp = layer.mlp
        self.mlp_norm = layer.post_mlp_layernorm

    def forward(self, hidden: torch.Tensor, rotary: Rotary, sequences: Sequences) -> torch.Tensor:
        tokens = len(hidden)
        projected = self.qkv(hidden).view(tokens, 3, self.heads, self.head_size)
        query, key, value = projected.unbind(1)
        query, key = self.rotate(query, key, *rotary, unsqueeze_dim=1)
        context = varlen_attention(query, key, value, sequences, self.causal)
        attended = self.attention_output(context.reshape(tokens, self.heads * self.head_size))
        hidden = self.attention_norm(hidden + attended)
        return self.mlp_norm(hidden + self.mlp(hidden))


class FlatNomicBert(nn.Module):
    """A NomicBERT encoder over a flat batch: `model(input_ids, sequences)` with
    `input_ids` [tokens] gives the last hidden state [tokens, hidden]."""

    def __init__(self, model: Any, causal: bool = False) -> None:
        super().__init__()
        from transformers.models.nomic_bert.modeling_nomic_bert import apply_rotary_pos_emb

        self.config = model.config
        self.embeddings = model.embeddings
        self.rotary = model.rotary_emb
        heads = int(self.config.num_attention_heads)
        self.layers = nn.ModuleList(
            FlatNomicBertLayer(layer, heads, apply_rotary_pos_emb, causal)
            for layer in model.layers[: self.config.num_hidden_layers]
        )

    def forward(self, input_ids: torch.Tensor, sequences: Sequences) -> torch.Tensor:
        hidden = self.embeddings(input_ids)
        if not len(input_ids):
            return hidden
        positions = sequences.positions().unsqueeze(0)
        cos, sin = self.rotary(hidden, positions)
        rotary = (cos[0], sin[0])
        for layer in self.layers:
            hidden = layer(hidden, rotary, sequences)
        return hidden


NOMIC_BERT_FAMILY = FlatFamily(
    "nomic_bert", frozenset({"nomic_bert"}), FlatNomicBert, support=_support
)

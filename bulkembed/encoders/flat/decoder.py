"""Causal rotary decoders on flat batches (unpadded): Qwen3, Qwen2, Llama and Mistral, the
tokens of a batch laid end to end.

These decoders share one layer: RMS norm, query, key and value projections (with biases in
Qwen2; Qwen3 then norms each head's queries and keys), rotary embeddings, causal attention
with keys and values of fewer heads than queries (grouped-query attention), output
projection and residual; then RMS norm, gated feed-forward block and residual (pre-norm).
Each token attends to the tokens up to itself in its own document, through
`varlen.varlen_attention`; rotary positions restart at each document, so a document's
vectors are those of the model run on it alone.

Some layers attend over a sliding window: every layer of a Mistral model whose
`sliding_window` is set, and the "sliding_attention" layers of `config.layer_types` in Qwen2
and Qwen3 (`use_sliding_window`, from layer `max_window_layers` on). A token there sees
itself and the `sliding_window - 1` tokens before it: transformers masks
`kv_idx > q_idx - sliding_window` (`masking_utils.sliding_window_overlay`) and gives flash
attention a `window_size` of (sliding_window - 1, sliding_window - 1) with causal masking
(`modeling_flash_attention_utils`). Here such a layer passes a window of
(sliding_window - 1, -1): the window bounds how far back a token sees, the causal flag masks
the tokens after it. Llama has no sliding window.

`FlatDecoder` is built from a loaded Hugging Face `Qwen3Model`, `Qwen2Model`, `LlamaModel`
or `MistralModel` and uses its modules: the token embeddings, each layer's norms, output
projection and feed-forward block, the rotary embedding module (any rope scaling fixed at
loading is the model's own) and the final norm; each layer's query, key and value
projections become one fused projection (one matrix multiply instead of three). It computes
what the model does in eval mode, without dropout.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bulkembed.encoders.flat.fused import fused_projection
from bulkembed.encoders.flat.registry import FlatFamily
from bulkembed.encoders.flat.rotary import Rotary, rotary_angles, rotate
from bulkembed.encoders.varlen import FULL, Sequences, Window, varlen_attention

FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"

# Rotary embeddings whose frequencies change with the longest sequence of each call.
_BATCH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})


def _support(model: Any) -> str | None:
    """Why a Qwen3, Qwen2, Llama or Mistral model cannot run flat; None if it can."""
    config = model.config
    if not all(hasattr(model, part) for part in ("embed_tokens", "layers", "rotary_emb", "norm")):
        return "it is not a bare decoder model"
    code = type(model).__module__
    if not code.startswith("transformers.models."):
        return f"its code ({code}) is not transformers' own"
    if not getattr(config, "is_causal", True):
        return "its attention is bidirectional (is_causal false)"
    for kind in sorted(set(getattr(config, "layer_types", None) or ())):
        if kind not in (FULL_ATTENTION, SLIDING_ATTENTION):
            return f"its layer type {kind} is neither {FULL_ATTENTION} nor {SLIDING_ATTENTION}"
    rope = model.rotary_emb.rope_type
    if not isinstance(rope, str) or rope in _BATCH_DEPENDENT_ROPE:
        return f"its rotary embeddings are {rope}, which change with each batch's longest text"
    for layer in model.layers:
        attention = layer.self_attn
        if attention.scaling != attention.head_dim**-0.5:
            return f"its attention scales scores by {attention.scaling}, not 1/sqrt(head size)"
    return None


def _windows(config: Any) -> list[Window]:
    """Each layer's attention window as transformers masks it: `sliding_window - 1` tokens
    before each token in a sliding layer (every Mistral layer if it has a sliding window,
    the "sliding_attention" layers of Qwen2 and Qwen3), the whole document before it in
    the others."""
    layers = int(config.num_hidden_layers)
    sliding = getattr(config, "sliding_window", None)
    if config.model_type == "llama" or sliding is None:
        return [FULL] * layers
    if config.model_type == "mistral":
        return [(int(sliding) - 1, -1)] * layers
    return [
        (int(sliding) - 1, -1) if kind == SLIDING_ATTENTION else FULL for kind in config.layer_types
    ]


class FlatDecoderLayer(nn.Module):
    """One decoder layer over [tokens, hidden]: RMS norm, fused QKV projection, per-head
    query and key norms (Qwen3), rotary embeddings, attention within each document (within
    `window` before each token in a sliding layer), output projection and residual; then
    RMS norm, feed-forward block and residual (pre-norm)."""

    def __init__(self, layer: Any, window: Window, causal: bool) -> None:
        super().__init__()
        self.window, self.causal = window, causal
        attention = layer.self_attn
        self.head_size = int(attention.head_dim)
        parts = (attention.q_proj, attention.k_proj, attention.v_proj)
        self.widths = [p.out_features for p in parts]
        self.qkv = fused_projection(parts)
        self.query_norm = getattr(attention, "q_norm", None) or nn.Identity()
        self.key_norm = getattr(attention, "k_norm", None) or nn.Identity()
        self.attention_output = attention.o_proj
        self.attention_norm = layer.input_layernorm
        self.mlp_norm = layer.post_attention_layernorm
        self.mlp = layer.mlp

    def forward(self, hidden: torch.Tensor, rotary: Rotary, sequences: Sequences) -> torch.Tensor:
        tokens = len(hidden)
        projected = self.qkv(self.attention_norm(hidden))
        query, key, value = (
            part.view(tokens, -1, self.head_size) for part in projected.split(self.widths, dim=-1)
        )
        query = rotate(self.query_norm(query), rotary)
        key = rotate(self.key_norm(key), rotary)
        context = varlen_attention(query, key, value, sequences, self.causal, self.window)
        hidden = hidden + self.attention_output(context.reshape(tokens, -1))
        return hidden + self.mlp(self.mlp_norm(hidden))


class FlatDecoder(nn.Module):
    """A Qwen3, Qwen2, Llama or Mistral decoder over a flat batch: `model(input_ids,
    sequences)` with `input_ids` [tokens] gives the last hidden state [tokens, hidden]."""

    def __init__(self, model: Any, causal: bool = True) -> None:
        super().__init__()
        self.config = model.config
        self.embed_tokens = model.embed_tokens
        self.rotary = model.rotary_emb
        layers = model.layers[: self.config.num_hidden_layers]
        self.layers = nn.ModuleList(
            FlatDecoderLayer(layer, window, causal)
            for layer, window in zip(layers, _windows(self.config), strict=True)
        )
        self.norm = model.norm

    def forward(self, input_ids: torch.Tensor, sequences: Sequences) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        if not len(input_ids):
            return hidden
        rotary = rotary_angles(self.rotary, hidden, sequences)
        for layer in self.layers:
            hidden = layer(hidden, rotary, sequences)
        return self.norm(hidden)


DECODER_FAMILY = FlatFamily(
    "decoder",
    frozenset({"qwen3", "qwen2", "llama", "mistral"}),
    FlatDecoder,
    causal=True,
    support=_support,
)

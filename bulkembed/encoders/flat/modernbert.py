"""The ModernBERT family on flat batches (unpadded): the tokens of a batch laid end to end.

ModernBERT is a pre-norm encoder with rotary positions and a gated feed-forward block. Its
layers attend in one of two ways (`config.layer_types`): global layers (every
`global_attn_every_n_layers`-th, the first included) over the whole document, local layers
over a window of `config.local_attention` tokens around each token: a token sees the tokens
at most `config.sliding_window` = `local_attention // 2` places before and after it (64 for
ModernBERT-base's 128). Transformers masks |query - key| <= sliding_window
(`masking_utils.sliding_window_bidirectional_overlay`) and gives flash attention a
`window_size` of (sliding_window, sliding_window) (the attention's `sliding_window + 1`,
less the 1 that `modeling_flash_attention_utils` takes off): here each local layer passes
that window to `varlen.varlen_attention`. Global and local layers turn queries and keys by
rotary embeddings of their own base (rope_theta 160,000 and 10,000 in ModernBERT-base).

`FlatModernBert` is built from a loaded Hugging Face `ModernBertModel` and uses its modules:
the embeddings (token embeddings and norm), each layer's norms, fused query-key-value
projection `Wqkv`, output projection `Wo` and feed-forward block, the rotary embedding
module (given position ids that restart at each document), and the final norm. It computes
what the model does in eval mode, without dropout.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from bulkembed.encoders.flat.registry import FlatFamily
from bulkembed.encoders.flat.rotary import Rotary, rotary_angles, rotate
from bulkembed.encoders.varlen import FULL, Sequences, Window, varlen_attention

GLOBAL, LOCAL = "full_attention", "sliding_attention"

# Rotary embeddings whose frequencies are fixed when the model loads; "dynamic" and
# "longrope" ones change with the longest document of each batch.
_FIXED_ROPE = frozenset({"default", "linear", "yarn", "llama3", "proportional"})


def _support(model: Any) -> str | None:
    """Why a ModernBERT model cannot run flat; None if it can."""
    config = model.config
    parts = ("embeddings", "layers", "rotary_emb", "final_norm")
    if not all(hasattr(model, part) for part in parts):
        return "it is not a bare encoder model"
    for kind in sorted(set(config.layer_types)):
        if kind not in (GLOBAL, LOCAL):
            return f"its layer type {kind} is neither {GLOBAL} nor {LOCAL}"
        rope_type = ((config.rope_parameters or {}).get(kind) or {}).get("rope_type")
        if rope_type not in _FIXED_ROPE:
            fixed = ", ".join(sorted(_FIXED_ROPE))
            return (
                f"the rotary embeddings of its {kind} layers are {rope_type}, "
                f"not one fixed at loading ({fixed})"
            )
    return None


class FlatModernBertLayer(nn.Module):
    """One ModernBERT layer over [tokens, hidden]: norm, fused QKV projection, rotary
    embeddings, attention within each document (within `window` of each token in a local
    layer), output projection and residual; then norm, gated feed-forward block and
    residual (pre-norm)."""

    def __init__(self, layer: Any, window: Window, causal: bool) -> None:
        super().__init__()
        self.window, self.causal = window, causal
        self.heads = int(layer.config.num_attention_heads)
        self.head_size = int(layer.attn.head_dim)
        self.attention_norm = layer.attn_norm
        self.qkv = layer.attn.Wqkv
        self.attention_output = layer.attn.Wo
        self.mlp_norm = layer.mlp_norm
        self.mlp = layer.mlp

    def forward(self, hidden: torch.Tensor, rotary: Rotary, sequences: Sequences) -> torch.Tensor:
        tokens, width = hidden.shape
        projected = self.qkv(self.attention_norm(hidden))
        query, key, value = projected.view(tokens, 3, self.heads, self.head_size).unbind(1)
        query, key = rotate(query, rotary, in_float32=True), rotate(key, rotary, in_float32=True)
        context = varlen_attention(query, key, value, sequences, self.causal, self.window)
        hidden = hidden + self.attention_output(context.reshape(tokens, width))
        return hidden + self.mlp(self.mlp_norm(hidden))


class FlatModernBert(nn.Module):
    """A ModernBERT encoder over a flat batch: `model(input_ids, sequences)` with
    `input_ids` [tokens] gives the last hidden state [tokens, hidden]."""

    def __init__(self, model: Any, causal: bool = False) -> None:
        super().__init__()
        self.config = model.config
        self.embeddings = model.embeddings
        self.rotary = model.rotary_emb
        # Each layer's type (GLOBAL or LOCAL): which rotary angles it takes.
        self.kinds: tuple[str, ...] = tuple(layer.attention_type for layer in model.layers)
        half = int(self.config.sliding_window)
        windows = [(half, half) if kind == LOCAL else FULL for kind in self.kinds]
        self.layers = nn.ModuleList(
            FlatModernBertLayer(layer, window, causal)
            for layer, window in zip(model.layers, windows, strict=True)
        )
        self.final_norm = model.final_norm

    def forward(self, input_ids: torch.Tensor, sequences: Sequences) -> torch.Tensor:
        hidden = self.embeddings(input_ids)
        if not len(input_ids):
            return hidden
        # Each layer type's angles: global and local layers turn by bases of their own.
        angles = {
            kind: rotary_angles(self.rotary, hidden, sequences, kind) for kind in set(self.kinds)
        }
        for layer, kind in zip(self.layers, self.kinds, strict=True):
            hidden = layer(hidden, angles[kind], sequences)
        return self.final_norm(hidden)


MODERNBERT_FAMILY = FlatFamily(
    "modernbert", frozenset({"modernbert"}), FlatModernBert, support=_support
)

"""Causal rotary decoders run flat: tiny random Qwen3, Qwen2, Llama and Mistral models give,
on documents of 1 to 300 tokens laid end to end, the last hidden state of the transformers
model run padded; without the causal flag, or with a sliding window missing or off by one,
they do not. The bundled Qwen3-Embedding recipe runs flat through the CLI and writes the
vectors of a padded run."""

import numpy as np
import pytest
import torch
from end_to_end.test_recipes import _tiny_model
from flat_models import (
    flat_and_padded_runs,
    flat_hidden_states,
    padded_hidden_states,
    random_documents,
)

from bulkembed.encoders.flat import flat_family, flat_module
from bulkembed.encoders.flat.decoder import DECODER_FAMILY, SLIDING_ATTENTION
from bulkembed.encoders.varlen import FULL
from bulkembed.models.recipes import find_recipe

# Documents past the sliding window (32 tokens), within it, of one token.
LENGTHS = [300, 257, 64, 17, 2, 1]
VOCABULARY = 400
WINDOW = 32

SMALL = dict(
    vocab_size=VOCABULARY,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=320,
    pad_token_id=0,
)
# Each architecture's tiny config: Qwen3 with yarn rope scaling, Qwen2 (biased projections)
# with its second layer sliding, Llama with llama3 rope scaling and a head size apart from
# hidden / heads, Mistral sliding in every layer.
CONFIGS = {
    "qwen3": dict(
        head_dim=16,
        num_key_value_heads=1,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 80,
        },
    ),
    "qwen2": dict(
        num_key_value_heads=2, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
    ),
    "llama": dict(
        head_dim=16,
        num_key_value_heads=2,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "mistral": dict(num_key_value_heads=1, sliding_window=WINDOW),
}


def _tiny_decoder(model_type: str, **changes):
    """A random 2-layer decoder of `model_type` (hidden 32, 4 query heads)."""
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(model_type, **{**SMALL, **CONFIGS[model_type], **changes})
    torch.manual_seed(0)
    return AutoModel.from_config(config).eval()


def _difference(module, documents: list[torch.Tensor], expected: torch.Tensor) -> float:
    return float((flat_hidden_states(module, documents) - expected).abs().max())


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_flat_decoder_equals_the_padded_model(model_type):
    model = _tiny_decoder(model_type)
    assert flat_family(model) is DECODER_FAMILY
    documents = random_documents(LENGTHS, VOCABULARY)
    expected = padded_hidden_states(model, documents)
    module = flat_module(DECODER_FAMILY, model)
    assert module.config is model.config
    assert _difference(module, documents, expected) <= 1e-5

    windows = [layer.window for layer in module.layers]
    for layer in module.layers:
        layer.causal = False
    assert _difference(module, documents, expected) > 1e-3
    for layer in module.layers:
        layer.causal = True
    if model_type == "qwen2":
        assert model.config.layer_types == ["full_attention", SLIDING_ATTENTION]
        assert windows == [FULL, (WINDOW - 1, -1)]
    if model_type == "mistral":
        assert windows == [(WINDOW - 1, -1)] * 2
    if any(window != FULL for window in windows):
        # Sliding layers seeing the whole document, or one token fewer or more.
        for window in (FULL, (WINDOW - 2, -1), (WINDOW, -1)):
            for layer, kept in zip(module.layers, windows, strict=True):
                layer.window = window if kept != FULL else FULL
            assert _difference(module, documents, expected) > 1e-3, window


def test_decoders_that_cannot_run_flat_say_why():
    model = _tiny_decoder("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    assert "rotary embeddings are dynamic" in flat_family(model)
    model = _tiny_decoder("qwen3")
    model.config.is_causal = False
    assert "bidirectional" in flat_family(model)
    model = _tiny_decoder("qwen2")
    model.config.layer_types = ["full_attention", "chunked_attention"]
    assert "layer type chunked_attention" in flat_family(model)


def test_qwen3_embedding_recipe_runs_flat_through_the_cli(tmp_path, tiny_bert):
    recipe = find_recipe("qwen3-embedding-0.6b")
    # A dense qwen3 recipe takes the tiny WordPiece tokenizer only (no BGE-M3, no ColBERT).
    model = _tiny_model(recipe, tmp_path / "model", tiny_bert, None, None)
    found = flat_and_padded_runs(tmp_path, model, recipe.name, "dense")
    assert np.stack(found["flat"]).shape == (15, 32)
    np.testing.assert_allclose(found["flat"], found["padded"], rtol=0, atol=1e-5)

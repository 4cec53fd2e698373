"""The ModernBERT family runs flat: global and local layers of a tiny random ModernBERT give,
on documents longer than the local window, the last hidden state of the transformers model
run padded; with the local window missing or off by one they do not. Both bundled
ModernBERT recipes run flat through the CLI and write the vectors of a padded run."""

import json

import numpy as np
import pytest
import torch
from end_to_end.test_recipes import EXTRA, _tiny_model
from flat_models import (
    flat_and_padded_runs,
    flat_hidden_states,
    padded_hidden_states,
    random_documents,
)

from bulkembed.encoders.flat import flat_family, flat_module
from bulkembed.encoders.flat.modernbert import LOCAL, MODERNBERT_FAMILY
from bulkembed.encoders.varlen import FULL
from bulkembed.models.recipes import find_recipe

# Documents past the local window (16 tokens: 8 each side), at it, within it, of one token.
LENGTHS = [300, 257, 64, 17, 16, 15, 2, 1]
VOCABULARY = 400


def _tiny_modernbert(attention: str = "sdpa"):
    """A random 4-layer ModernBERT (hidden 32): global layers 0 and 2, local layers 1 and 3
    with a window of 16 tokens, attending with transformers' `attention` implementation."""
    from transformers import ModernBertConfig, ModernBertModel

    config = ModernBertConfig(
        vocab_size=VOCABULARY,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=320,
        global_attn_every_n_layers=2,
        local_attention=16,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        cls_token_id=2,
        sep_token_id=3,
    )
    config._attn_implementation = attention
    torch.manual_seed(0)
    return ModernBertModel(config).eval()


def _set_local_windows(module, window) -> None:
    for layer, kind in zip(module.layers, module.kinds, strict=True):
        layer.window = window if kind == LOCAL else FULL


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_flat_modernbert_equals_the_padded_model(attention):
    model = _tiny_modernbert(attention)
    assert model.config.layer_types == ["full_attention", LOCAL] * 2
    assert model.config.sliding_window == 8
    assert flat_family(model) is MODERNBERT_FAMILY
    documents = random_documents(LENGTHS, VOCABULARY)
    expected = padded_hidden_states(model, documents)
    module = flat_module(MODERNBERT_FAMILY, model)
    assert module.config is model.config
    assert (flat_hidden_states(module, documents) - expected).abs().max() <= 1e-5

    # Local layers seeing the whole document, or one token fewer or more on each side.
    for window in (FULL, (7, 7), (9, 9)):
        _set_local_windows(module, window)
        assert (flat_hidden_states(module, documents) - expected).abs().max() > 1e-3, window


def test_modernbert_models_that_cannot_run_flat_say_why():
    model = _tiny_modernbert()
    model.config.rope_parameters[LOCAL]["rope_type"] = "dynamic"
    assert "rotary embeddings of its sliding_attention layers are dynamic" in flat_family(model)
    model = _tiny_modernbert()
    model.config.layer_types = ["full_attention", "chunked_attention"] * 2
    assert "layer type chunked_attention" in flat_family(model)


@pytest.mark.parametrize("name", ["gte-modernbert-base", "gte-moderncolbert-v1"])
def test_modernbert_recipes_run_flat_through_the_cli(
    tmp_path, monkeypatch, tiny_bert, tiny_bge_m3, tiny_colbert, name
):
    recipe = find_recipe(name)
    # A window of 16 tokens, which documents of up to 64 tokens pass.
    monkeypatch.setitem(EXTRA["modernbert"], "local_attention", 16)
    model = _tiny_model(recipe, tmp_path / "model", tiny_bert, tiny_bge_m3, tiny_colbert)
    assert json.loads((model / "config.json").read_text())["local_attention"] == 16
    found = flat_and_padded_runs(tmp_path, model, name, recipe.outputs[0])
    for flat, padded in zip(found["flat"], found["padded"], strict=True):
        assert flat.shape == padded.shape
        np.testing.assert_allclose(flat, padded, rtol=0, atol=1e-5)

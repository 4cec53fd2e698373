"""The NomicBERT family runs flat: a tiny random NomicBERT gives, on documents of 1 to 300
tokens in one flat batch, the last hidden state of the transformers model run padded (with
its default rotary embeddings, and with dynamic ones scaled past the trained length); with
no document boundaries, or with no rotary embeddings, it does not. The bundled
nomic-embed-text-v1.5 recipe runs flat through the CLI and writes the vectors of a padded
run."""

import json

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
from bulkembed.encoders.flat.nomic_bert import NOMIC_BERT_FAMILY
from bulkembed.encoders.varlen import Sequences
from bulkembed.models.recipes import find_recipe

LENGTHS = [300, 257, 64, 17, 2, 1]
VOCABULARY = 400
# Rotary embeddings scaled dynamically past 128 tokens (the longest document has 300).
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1000.0}
# Query and key weights scaled up from their initial 0.02 spread: attention scores of a few
# units, not near 0, so that which token sees which (and at what distance) shows.
SHARPEN = 15.0


def _config(**settings):
    from transformers import NomicBertConfig

    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    return NomicBertConfig(vocab_size=VOCABULARY, **sizes, **settings)


def _tiny_nomic_bert(attention: str = "sdpa", rope: dict | None = None):
    """A random 2-layer NomicBERT (hidden 32) with sharpened attention, attending with
    transformers' `attention` implementation; rotary embeddings as `rope` says (None: the
    default ones)."""
    from transformers import NomicBertModel

    if rope is None:
        config = _config(max_position_embeddings=320)
    else:
        config = _config(max_position_embeddings=128, rope_parameters=rope)
    config._attn_implementation = attention
    torch.manual_seed(0)
    model = NomicBertModel(config).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.q_proj.weight.mul_(SHARPEN)
            layer.self_attn.k_proj.weight.mul_(SHARPEN)
    return model


@pytest.mark.parametrize(
    ("attention", "rope"), [("sdpa", None), ("eager", None), ("sdpa", DYNAMIC)]
)
def test_flat_nomic_bert_equals_the_padded_model(monkeypatch, attention, rope):
    model = _tiny_nomic_bert(attention, rope)
    assert flat_family(model) is NOMIC_BERT_FAMILY
    documents = random_documents(LENGTHS, VOCABULARY)
    expected = padded_hidden_states(model, documents)
    module = flat_module(NOMIC_BERT_FAMILY, model)
    assert module.config is model.config
    assert (flat_hidden_states(module, documents) - expected).abs().max() <= 1e-5
    if rope is not None:
        rotary = model.rotary_emb
        assert not torch.equal(rotary.inv_freq, rotary.original_inv_freq)  # scaled

    # All tokens in one document; then every token at position 0 (no rotary turn). Positions
    # counted over the whole batch would shift each document's by a constant, which rotary
    # attention, seeing only the distance between tokens, does not tell apart.
    assert (flat_hidden_states(module, documents, [sum(LENGTHS)]) - expected).abs().max() > 1e-3
    monkeypatch.setattr(Sequences, "positions", lambda self: torch.zeros_like(self.token_documents))
    assert (flat_hidden_states(module, documents) - expected).abs().max() > 1e-3


def test_nomic_bert_models_that_cannot_run_flat_say_why():
    from transformers import NomicBertForMaskedLM

    model = NomicBertForMaskedLM(_config(max_position_embeddings=64))
    assert "not transformers' bare NomicBertModel" in flat_family(model)


def test_nomic_embed_recipe_runs_flat_through_the_cli(tmp_path, tiny_bert):
    recipe = find_recipe("nomic-embed-text-v1.5")
    # A dense recipe on a BERT tokenizer: no BGE-M3 or ColBERT model is read.
    model = _tiny_model(recipe, tmp_path / "model", tiny_bert, None, None)
    assert json.loads((model / "config.json").read_text())["model_type"] == "nomic_bert"
    found = flat_and_padded_runs(tmp_path, model, recipe.name, "dense")
    assert np.stack(found["flat"]).shape == np.stack(found["padded"]).shape == (15, 32)
    np.testing.assert_allclose(found["flat"], found["padded"], rtol=0, atol=1e-5)

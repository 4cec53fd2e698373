"""Every bundled recipe runs end to end on a tiny random model of its architecture."""

import shutil

import numpy as np
import pytest
from helpers import embed_texts, sample_texts

from bulkembed.models.recipes import list_recipes

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

# Tiny sizes for each architecture; token ids follow the tiny WordPiece tokenizer
# ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3).
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
EXTRA = {
    "bert": {"max_position_embeddings": 130},
    "nomic_bert": {"max_position_embeddings": 130},
    "modernbert": dict(
        max_position_embeddings=130, pad_token_id=0, bos_token_id=2, eos_token_id=3,
        cls_token_id=2, sep_token_id=3,
    ),
    "qwen3": dict(
        max_position_embeddings=130, head_dim=16, num_key_value_heads=1, pad_token_id=0,
        bos_token_id=2, eos_token_id=3,
    ),
    "xlm-roberta": {"max_position_embeddings": 130, "pad_token_id": 1},
}  # fmt: skip


# The width of the tiny models' dense vectors: CLIP's projection is 24 wide.
WIDTH = {"clip": 24}


def _tiny_model(recipe, folder, tiny_bert, tiny_bge_m3, tiny_colbert, request=None):
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

    if recipe.family == "bge-m3":
        shutil.copytree(tiny_bge_m3, folder)
        return folder
    if recipe.family == "clip":
        shutil.copytree(request.getfixturevalue(f"tiny_{recipe.model_type}"), folder)
        return folder
    tokenizer_source = tiny_bge_m3 if recipe.model_type == "xlm-roberta" else tiny_bert
    vocabulary = 500 if recipe.model_type == "xlm-roberta" else 400
    if recipe.family == "colbert":
        # The PyLate layout of the tiny ColBERT model, on this recipe's architecture.
        shutil.copytree(tiny_colbert, folder, ignore=shutil.ignore_patterns("*.safetensors"))
        shutil.copytree(tiny_colbert / "1_Dense", folder / "1_Dense", dirs_exist_ok=True)
        tokenizer_source, vocabulary = tiny_colbert, 402
    config = AutoConfig.for_model(
        recipe.model_type, vocab_size=vocabulary, **TINY, **EXTRA[recipe.model_type]
    )
    torch.manual_seed(0)
    kind = AutoModelForMaskedLM if recipe.family == "splade" else AutoModel
    kind.from_config(config).eval().save_pretrained(folder)
    if recipe.family == "colbert":
        return folder
    for name in TOKENIZER_FILES:
        if (tokenizer_source / name).exists():
            shutil.copy(tokenizer_source / name, folder / name)
    return folder


@pytest.mark.parametrize("recipe", list_recipes(), ids=lambda r: r.name)
def test_every_recipe_runs_through_the_cli(
    tmp_path, tiny_bert, tiny_bge_m3, tiny_colbert, recipe, request
):
    model = _tiny_model(recipe, tmp_path / "model", tiny_bert, tiny_bge_m3, tiny_colbert, request)
    texts = sample_texts(12) + ["", "short"]
    args = ["--recipe", recipe.name, "--max-length", "32"]
    table, _ = embed_texts(tmp_path, model, texts, *args)
    assert table.schema.names == ["id", *recipe.outputs, "content_hash"]
    assert sorted(table.column("id").to_pylist(), key=int) == [str(i) for i in range(len(texts))]
    if "dense" in recipe.outputs:
        dense = np.array(table.column("dense").to_pylist())
        assert dense.shape == (len(texts), WIDTH.get(recipe.model_type, 32))
        np.testing.assert_allclose(np.linalg.norm(dense, axis=1), 1.0, rtol=1e-5)
    if "sparse" in recipe.outputs:
        assert all(len(row["indices"]) for row in table.column("sparse").to_pylist()[:12])
    if "multivector" in recipe.outputs:
        rows = table.column("multivector").to_pylist()
        assert all(len(row) for row in rows[:12])


def test_decoder_model_with_last_token_pooling_matches_left_padded_sentence_transformers(
    tmp_path, tiny_bert
):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer
    from transformers import AutoConfig, AutoModel

    decoder = tmp_path / "decoder"
    config = AutoConfig.for_model("qwen3", vocab_size=400, **TINY, **EXTRA["qwen3"])
    torch.manual_seed(3)
    AutoModel.from_config(config).eval().save_pretrained(decoder)
    for name in TOKENIZER_FILES:
        if (tiny_bert / name).exists():
            shutil.copy(tiny_bert / name, decoder / name)
    folder = tmp_path / "st-decoder"
    transformer = Transformer(
        str(decoder), max_seq_length=64, tokenizer_args={"padding_side": "left"}
    )
    assert transformer.tokenizer.padding_side == "left"
    SentenceTransformer(
        modules=[transformer, Pooling(32, "lasttoken"), Normalize()], device="cpu"
    ).save(str(folder))

    texts = sample_texts(24) + ["a", "two words"]
    table, _ = embed_texts(tmp_path, folder, texts)
    ours = np.array(table.column("dense").to_pylist())
    loaded = SentenceTransformer(str(folder), device="cpu")
    assert loaded[0].tokenizer.padding_side == "left"
    reference = loaded.encode(texts, batch_size=8)
    assert (ours * reference).sum(axis=1).min() >= 0.9999

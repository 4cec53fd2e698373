"""BGE-M3 and SPLADE outputs against FlagEmbedding and sentence-transformers."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import bge_m3_reference, embed_texts, mixed_texts, write_jsonl
from tokenizers import Tokenizer
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.models.model_files import model_version
from bulkembed.version import __version__

runner = CliRunner()


def _embed(tmp_path, model, texts, *extra):
    # float32 on every CPU: the references compute in float32.
    options = ("--max-batch-tokens", "512", "--dtype", "float32")
    return embed_texts(tmp_path, model, texts, *options, *extra)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "openvino"])
def test_bge_m3_matches_flagembedding(tmp_path, tiny_bge_m3, backend):
    texts = mixed_texts()
    assert len(texts) >= 30
    table, out = _embed(tmp_path, tiny_bge_m3, texts, "--max-length", "64", "--backend", backend)
    reference = bge_m3_reference(tiny_bge_m3, texts)

    schema = table.schema
    assert schema.field("sparse").type == pa.struct(
        [pa.field("indices", pa.list_(pa.int32())), pa.field("values", pa.list_(pa.float32()))]
    )
    multivector = schema.field("multivector").type
    assert pa.types.is_list(multivector) and multivector.value_type == pa.list_(pa.float32(), 32)

    dense = np.array(table.column("dense").to_pylist())
    assert (dense * reference["dense_vecs"]).sum(axis=1).min() >= 0.9999

    for row, expected in zip(
        table.column("sparse").to_pylist(), reference["lexical_weights"], strict=True
    ):
        assert row["indices"] == sorted(row["indices"])
        assert row["indices"] == sorted(int(k) for k in expected)
        np.testing.assert_allclose(
            row["values"], [expected[str(i)] for i in row["indices"]], atol=1e-4, rtol=0
        )
    assert sum(len(r["indices"]) for r in table.column("sparse").to_pylist()) > 100

    for row, expected in zip(
        table.column("multivector").to_pylist(), reference["colbert_vecs"], strict=True
    ):
        ours = np.array(row).reshape(-1, 32)
        assert ours.shape == expected.shape
        if len(ours):
            expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
            assert (ours * expected).sum(axis=1).min() >= 0.9999

    # vocab.json: the token of each vocabulary id at its position.
    vocabulary = json.loads((out / "_bulkembed" / "vocab.json").read_text())
    tokenizer = Tokenizer.from_file(str(tiny_bge_m3 / "tokenizer.json"))
    assert vocabulary[0] == "<s>" and vocabulary[2] == "</s>" and len(vocabulary) == 500
    terms = {vocabulary[i] for row in table.column("sparse").to_pylist() for i in row["indices"]}
    assert terms == {
        tokenizer.id_to_token(i) for row in reference["lexical_weights"] for i in map(int, row)
    }

    # The schema metadata says how to search the parts.
    metadata = pq.read_schema(next(out.glob("*.parquet"))).metadata
    config = tiny_bge_m3 / "config.json"
    encoder = json.loads(metadata.pop(b"bulkembed.encoder"))
    assert encoder["model"] == str(tiny_bge_m3)
    assert encoder["outputs"] == ["dense", "sparse", "multivector"]
    assert encoder["version"] == model_version(str(tiny_bge_m3), None, config)
    assert {k: v for k, v in metadata.items() if k.startswith(b"bulkembed.")} == {
        b"bulkembed.model": str(tiny_bge_m3).encode(),
        b"bulkembed.revision": model_version(str(tiny_bge_m3), None, config).encode(),
        b"bulkembed.outputs": b"dense,sparse,multivector",
        b"bulkembed.dimension": b"32",
        b"bulkembed.normalized": b"true",
        b"bulkembed.metric": b"cosine",
        b"bulkembed.version": __version__.encode(),
    }


def test_bge_m3_outputs_can_be_chosen(tmp_path, tiny_bge_m3):
    table, _ = _embed(tmp_path, tiny_bge_m3, ["one text", "another"], "--outputs", "sparse")
    assert table.schema.names == ["id", "sparse", "content_hash"]
    metadata = table.schema.metadata
    assert metadata[b"bulkembed.outputs"] == b"sparse" and metadata[b"bulkembed.dimension"] == b""
    assert metadata[b"bulkembed.metric"] == b"dot"
    result = runner.invoke(
        app,
        [
            "run",
            str(tmp_path / "c.jsonl"),
            "--model",
            str(tiny_bge_m3),
            "--output",
            str(tmp_path / "x"),
            "--outputs",
            "dense,colbert",
        ],
    )
    assert result.exit_code == 2
    assert "unknown output colbert" in result.stderr


def test_the_bge_m3_recipe_writes_multivectors_only_when_asked(tmp_path, tiny_bge_m3):
    texts = ["one text", "another"]
    table, _ = _embed(tmp_path / "a", tiny_bge_m3, texts, "--recipe", "bge-m3")
    assert table.schema.names == ["id", "dense", "sparse", "content_hash"]
    outputs = ("--outputs", "dense,sparse,multivector")
    table, _ = _embed(tmp_path / "b", tiny_bge_m3, texts, "--recipe", "bge-m3", *outputs)
    assert table.schema.names == ["id", "dense", "sparse", "multivector", "content_hash"]


@pytest.mark.parametrize("backend", ["torch", "openvino"])
def test_splade_matches_sentence_transformers_sparse_encoder(tmp_path, tiny_splade, backend):
    from sentence_transformers import SparseEncoder

    texts = mixed_texts()
    table, _ = _embed(tmp_path, tiny_splade, texts, "--backend", backend)
    assert table.schema.names == ["id", "sparse", "content_hash"]
    reference = SparseEncoder(str(tiny_splade), device="cpu").encode(texts, convert_to_tensor=True)
    reference = reference.to_dense().numpy()
    for row, expected in zip(table.column("sparse").to_pylist(), reference, strict=True):
        assert row["indices"] == np.nonzero(expected > 0)[0].tolist()
        np.testing.assert_allclose(row["values"], expected[row["indices"]], atol=1e-4, rtol=0)


def test_sparse_top_k_keeps_the_largest_weights(tmp_path, tiny_splade):
    full, _ = _embed(tmp_path / "a", tiny_splade, ["a short text about python"])
    top, _ = _embed(
        tmp_path / "b", tiny_splade, ["a short text about python"], "--sparse-top-k", "5"
    )
    [row] = full.column("sparse").to_pylist()
    [kept] = top.column("sparse").to_pylist()
    best = sorted(np.argsort(row["values"])[-5:])
    assert kept["indices"] == [row["indices"][i] for i in best]


def test_colbert_pylate_layout_keeps_every_token_but_punctuation(tmp_path, tiny_colbert):
    import torch
    from transformers import AutoModel, AutoTokenizer

    texts = mixed_texts()
    table, _ = _embed(tmp_path, tiny_colbert, texts)
    assert table.schema.names == ["id", "multivector", "content_hash"]
    assert table.schema.field("multivector").type == pa.list_(pa.list_(pa.float32(), 16))

    tokenizer = AutoTokenizer.from_pretrained(tiny_colbert)
    model = AutoModel.from_pretrained(tiny_colbert).eval()
    linear = torch.nn.Linear(32, 16, bias=False)
    from safetensors.torch import load_file

    linear.weight.data = load_file(str(tiny_colbert / "1_Dense" / "model.safetensors"))[
        "linear.weight"
    ]
    marker = tokenizer.convert_tokens_to_ids("[D] ")
    skipped = set(tokenizer.convert_tokens_to_ids([".", ",", "!", "?", ":", "(", ")"]))
    for text, row in zip(texts, table.column("multivector").to_pylist(), strict=True):
        ids = tokenizer(text, truncation=True, max_length=47)["input_ids"]
        ids = [ids[0], marker, *ids[1:]]
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            expected = torch.nn.functional.normalize(linear(hidden), dim=-1).numpy()
        expected = expected[[i not in skipped for i in ids]]
        ours = np.array(row).reshape(-1, 16)
        assert ours.shape == expected.shape
        assert (ours * expected).sum(axis=1).min() >= 0.9999


def test_heads_not_asked_for_are_not_loaded(tiny_bge_m3):
    import torch

    from bulkembed.config import RunConfig
    from bulkembed.encoders import build_encoder
    from bulkembed.models.model_spec import resolve_model

    config = RunConfig(inputs=("x",), output="o", model=str(tiny_bge_m3), outputs=("dense",))
    encoder = build_encoder(resolve_model(config), "cpu", torch.float32)
    assert encoder.sparse_head is None and encoder.colbert_head is None
    assert (encoder.dense_dim, encoder.multivector_dim) == (32, None)


def test_bge_m3_sparse_top_k(tmp_path, tiny_bge_m3):
    text = ["a longer text with many different words in it to weigh"]
    full, _ = _embed(tmp_path / "a", tiny_bge_m3, text, "--outputs", "sparse")
    top, _ = _embed(tmp_path / "b", tiny_bge_m3, text, "--outputs", "sparse", "--sparse-top-k", "3")
    [row], [kept] = full.column("sparse").to_pylist(), top.column("sparse").to_pylist()
    assert len(row["indices"]) > 3
    best = sorted(np.argsort(row["values"])[-3:])
    assert kept["indices"] == [row["indices"][i] for i in best]


def test_sparse_output_from_a_model_without_a_masked_lm_head_is_refused(tmp_path, tiny_bert):
    import json
    import shutil

    result = runner.invoke(
        app,
        ["run", str(write_jsonl(tmp_path / "c.jsonl", [{"text": "x"}])), "--model", str(tiny_bert),
         "--output", str(tmp_path / "o"), "--outputs", "sparse", "--pooling", "mean"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--outputs sparse: a dense model produces only dense" in result.stderr
    # A folder that claims a masked-LM head its weights do not have.
    folder = tmp_path / "no-head"
    shutil.copytree(tiny_bert, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**config, "architectures": ["BertForMaskedLM"]})
    )
    result = runner.invoke(
        app,
        ["run", str(tmp_path / "c.jsonl"), "--model", str(folder), "--output", str(tmp_path / "o2"),
         "--outputs", "sparse", "--tokenize-workers", "0"],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "lacks a masked-LM head" in result.stderr


def test_dense_only_options_are_refused_for_other_families(tmp_path, tiny_bge_m3):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"text": "x"}])
    base = ["run", str(corpus), "--model", str(tiny_bge_m3), "--output", str(tmp_path / "o")]
    result = runner.invoke(app, [*base, "--pooling", "mean"])
    assert result.exit_code == 2
    assert "--pooling and --normalize apply to dense models" in result.stderr
    result = runner.invoke(app, [*base, "--outputs", "sparse", "--dim", "16"])
    assert result.exit_code == 2 and "--dim and --quantize apply to dense vectors" in result.stderr

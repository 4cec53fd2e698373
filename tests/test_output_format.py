"""--dim, --dtype-out and --quantize: checked against float32 output quantized here."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import (
    embed_texts,
    fill_the_disk_at_commit,
    run_cli,
    sample_texts,
    write_mixed_corpus,
)
from typer.testing import CliRunner

runner = CliRunner()

# A small budget makes several windows, so calibration sees only the first.
SMALL_BATCHES = ("--max-batch-tokens", 64)


def _corpus(tmp_path, n=90):
    records = [{"id": f"d{i:03d}", "text": t} for i, t in enumerate(sample_texts(n))]
    return write_mixed_corpus(tmp_path, records, n // 3, row_group_size=10)


def _dense(out):
    table = pq.read_table(out)
    order = np.argsort(table.column("id").to_pylist())
    return table.schema.field("dense").type, np.array(table.column("dense").to_pylist())[order]


@pytest.fixture
def float32_reference(tmp_path, tiny_st):
    corpus = _corpus(tmp_path)
    assert run_cli(corpus, tiny_st("mean"), tmp_path / "float32", *SMALL_BATCHES).exit_code == 0
    return corpus, _dense(tmp_path / "float32")[1]


def test_dim_truncates_then_normalizes_like_sentence_transformers(tmp_path, tiny_st):
    from sentence_transformers import SentenceTransformer

    corpus = _corpus(tmp_path, 30)
    assert (
        run_cli(corpus, tiny_st("mean"), tmp_path / "out", "--dim", "16", *SMALL_BATCHES).exit_code
        == 0
    )
    kind, ours = _dense(tmp_path / "out")
    assert kind == pa.list_(pa.float32(), 16)
    reference = SentenceTransformer(str(tiny_st("mean")), device="cpu", truncate_dim=16).encode(
        [t for t in sample_texts(30)], normalize_embeddings=True
    )
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)
    assert (ours * reference).sum(axis=1).min() >= 0.9999


def test_dim_outside_the_recipe_sizes_is_refused(tmp_path, tiny_bert):
    corpus = _corpus(tmp_path, 10)
    result = run_cli(
        corpus,
        tiny_bert,
        tmp_path / "out",
        "--recipe",
        "e5-base-v2",
        "--max-length",
        "64",
        "--dim",
        "16",
        *SMALL_BATCHES,
    )
    assert result.exit_code == 2
    assert "--dim 16: this model's vectors can be cut to 768" in result.stderr


def test_float16_output(tmp_path, tiny_st, float32_reference):
    corpus, reference = float32_reference
    assert (
        run_cli(
            corpus, tiny_st("mean"), tmp_path / "half", "--dtype-out", "float16", *SMALL_BATCHES
        ).exit_code
        == 0
    )
    kind, half = _dense(tmp_path / "half")
    assert kind == pa.list_(pa.float16(), 32)
    np.testing.assert_allclose(half, reference, atol=1e-3)


@pytest.mark.parametrize("mode", ["binary", "ubinary"])
def test_binary_quantization_packs_signs(tmp_path, tiny_st, float32_reference, mode):
    corpus, reference = float32_reference
    assert (
        run_cli(
            corpus, tiny_st("mean"), tmp_path / mode, "--quantize", mode, *SMALL_BATCHES
        ).exit_code
        == 0
    )
    kind, packed = _dense(tmp_path / mode)
    expected = np.packbits(reference > 0, axis=-1).astype(np.int16)
    if mode == "binary":
        assert kind == pa.list_(pa.int8(), 4)
        expected -= 128
    else:
        assert kind == pa.list_(pa.uint8(), 4)
    np.testing.assert_array_equal(packed, expected)


@pytest.mark.parametrize("mode", ["int8", "uint8"])
def test_integer_quantization_uses_one_range_for_every_part_and_every_resume(
    tmp_path, tiny_st, float32_reference, monkeypatch, mode
):
    corpus, reference = float32_reference
    out = tmp_path / mode
    with monkeypatch.context() as patched:
        fill_the_disk_at_commit(patched, 4)
        assert (
            run_cli(corpus, tiny_st("mean"), out, "--quantize", mode, *SMALL_BATCHES).exit_code == 1
        )
    ranges_before = json.loads((out / "_bulkembed" / "quantization.json").read_text())["ranges"]
    assert run_cli(corpus, tiny_st("mean"), out, "--quantize", mode, *SMALL_BATCHES).exit_code == 0
    stored = json.loads((out / "_bulkembed" / "quantization.json").read_text())
    assert stored == {"precision": mode, "ranges": ranges_before}

    kind, quantized = _dense(out)
    assert kind == pa.list_(pa.int8() if mode == "int8" else pa.uint8(), 32)
    low, high = np.array(stored["ranges"], dtype=np.float32)
    steps = np.where(high - low == 0, 1, (high - low) / 255)
    levels = np.clip(np.floor((reference.astype(np.float32) - low) / steps), 0, 255)
    expected = levels - 128 if mode == "int8" else levels
    assert np.abs(quantized - expected).max() <= 1  # float rounding at a level's edge
    assert (quantized == expected).mean() > 0.99
    # The ranges come from the first window only (not all 90 documents): later documents
    # fall outside them and are clipped to the end levels, the same in every part.
    assert ((reference < low) | (reference > high)).any()


def test_quantize_and_float16_conflict(tmp_path, tiny_st):
    corpus = _corpus(tmp_path, 10)
    result = run_cli(
        corpus,
        tiny_st("mean"),
        tmp_path / "o",
        "--quantize",
        "int8",
        "--dtype-out",
        "float16",
        *SMALL_BATCHES,
    )
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: --quantize int8 and --dtype-out float16 conflict: quantized vectors are "
        "integers; pass one of them"
    )


def test_a_refused_dim_leaves_the_output_usable(tmp_path, tiny_st):
    corpus = _corpus(tmp_path, 12)
    refused = run_cli(corpus, tiny_st("mean"), tmp_path / "out", "--dim", "999", *SMALL_BATCHES)
    assert refused.exit_code == 2
    assert "--dim 999: this model's vectors have 32" in refused.stderr
    assert run_cli(corpus, tiny_st("mean"), tmp_path / "out", *SMALL_BATCHES).exit_code == 0


def test_dim_on_a_model_that_does_not_normalize_only_truncates(tmp_path, tiny_st):
    corpus = _corpus(tmp_path, 12)
    model = tiny_st("mean", normalize=False)
    assert run_cli(corpus, model, tmp_path / "full", *SMALL_BATCHES).exit_code == 0
    assert run_cli(corpus, model, tmp_path / "cut", "--dim", "8", *SMALL_BATCHES).exit_code == 0
    full, cut = _dense(tmp_path / "full")[1], _dense(tmp_path / "cut")[1]
    np.testing.assert_allclose(cut, full[:, :8], rtol=1e-6)
    assert np.abs(np.linalg.norm(cut, axis=1) - 1).max() > 0.01


def test_layer_norm_before_the_cut_when_the_recipe_says_so(tiny_bert):
    import torch
    import torch.nn.functional as F

    from bulkembed.config import RunConfig
    from bulkembed.models.model_spec import resolve_model
    from bulkembed.output.format import OutputFormat

    config = RunConfig(
        inputs=("x",),
        output="o",
        model=str(tiny_bert),
        recipe="nomic-embed-text-v1.5",
        max_length=64,
    )
    assert resolve_model(config).matryoshka_layer_norm
    full = np.random.default_rng(0).normal(0.3, 1.0, size=(5, 32)).astype(np.float32)
    shaped = OutputFormat(dim=4, normalize=True, layer_norm_before_dim=True).truncate(full)
    reference = F.layer_norm(torch.from_numpy(full), normalized_shape=(32,))[:, :4]
    np.testing.assert_allclose(shaped, F.normalize(reference, dim=1).numpy(), rtol=1e-4, atol=1e-6)


def test_vectors_are_written_plain_and_read_alike_by_pyarrow_and_duckdb(tmp_path, tiny_bge_m3):
    import duckdb

    outputs = ("--outputs", "dense,sparse,multivector", "--dtype-out", "float16")
    table, out = embed_texts(tmp_path, tiny_bge_m3, sample_texts(6), *outputs)
    part = next(out.glob("part-*.parquet"))
    row_group = pq.read_metadata(part).row_group(0)
    columns = {
        row_group.column(i).path_in_schema: row_group.column(i)
        for i in range(row_group.num_columns)
    }
    for vector in ("dense.list.element", "multivector.list.element.list.element"):
        assert columns[vector].compression == "UNCOMPRESSED"
        assert not columns[vector].is_stats_set
        assert "RLE_DICTIONARY" not in columns[vector].encodings
    assert columns["id"].is_stats_set
    rows = duckdb.sql(f"SELECT id, dense, sparse, multivector FROM read_parquet('{part}')")
    by_id = {row[0]: row[1:] for row in rows.fetchall()}
    for record in table.to_pylist():
        dense, sparse, multivector = by_id[record["id"]]
        assert np.array_equal(np.float16(dense), np.float16(record["dense"]))
        assert sparse == record["sparse"]
        assert np.array_equal(np.float16(multivector), np.float16(record["multivector"]))

"""Ids made to collide: every distinct id keeps its own row and vector, in a plain run, a
Parquet `--since` change set and a LanceDB table synced in place.

`A` and `B` share the 64-bit hash of an unkeyed MurmurHash3-style mixer (its second block
solved for, in seconds): what anyone can build against a hash without a secret. A run finds
ids by hashes keyed with a secret of its own (`IdKey`), which no input can aim at."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from helpers import embed_texts, run_cli, sample_texts, write_jsonl

A, B = "doc-w1cgoiy0bawv", "doc-cml4yWW]em9["
SETTINGS = ("--dtype", "float32", "--max-length", "24")


@pytest.fixture(scope="module")
def texts():
    return sample_texts(4)


@pytest.fixture(scope="module")
def vectors(tmp_path_factory, tiny_st, texts):
    """Each text's dense vector, embedded under plain ids."""
    table, _ = embed_texts(tmp_path_factory.mktemp("plain"), tiny_st("mean"), texts, *SETTINGS)
    return np.array(table.column("dense").to_pylist())


def _rows(table) -> dict[str, np.ndarray]:
    ids = table.column("id").to_pylist()
    column = "vector" if "vector" in table.schema.names else "dense"
    return dict(zip(ids, np.array(table.column(column).to_pylist()), strict=True))


def _summary(meta) -> dict:
    return json.loads((meta / "summary.json").read_text())


def _assert_vectors(rows: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(rows) == sorted(expected)
    for doc_id, vector in expected.items():
        np.testing.assert_allclose(rows[doc_id], vector, atol=1e-6, err_msg=doc_id)


def test_a_plain_run_keeps_both_ids(tmp_path, tiny_st, texts, vectors):
    corpus = write_jsonl(
        tmp_path / "c.jsonl",
        [{"id": A, "text": texts[0]}, {"id": B, "text": texts[1]}, {"id": "c", "text": texts[2]}],
    )
    result = run_cli(corpus, tiny_st("mean"), tmp_path / "out", *SETTINGS)
    assert result.exit_code == 0, result.output
    _assert_vectors(
        _rows(pq.read_table(tmp_path / "out")), {A: vectors[0], B: vectors[1], "c": vectors[2]}
    )
    assert _summary(tmp_path / "out" / "_bulkembed")["bad_records"] == 0


def test_a_change_set_takes_an_id_renamed_to_its_twin(tmp_path, tiny_st, texts, vectors):
    model = tiny_st("mean")
    v1 = write_jsonl(
        tmp_path / "v1" / "c.jsonl", [{"id": A, "text": texts[0]}, {"id": "c", "text": texts[2]}]
    )
    assert run_cli(v1, model, tmp_path / "out-v1", *SETTINGS).exit_code == 0
    # A renamed B, its text unchanged.
    v2 = write_jsonl(
        tmp_path / "v2" / "c.jsonl", [{"id": B, "text": texts[0]}, {"id": "c", "text": texts[2]}]
    )
    out = tmp_path / "out-v2"
    since = ("--since", tmp_path / "out-v1", "--max-deletes", "all")
    result = run_cli(v2, model, out, *SETTINGS, *since)
    assert result.exit_code == 0, result.output
    _assert_vectors(_rows(pq.read_table(out)), {B: vectors[0], "c": vectors[2]})
    deletes = pq.read_table(out / "_bulkembed" / "changes" / "deletes.parquet")
    assert deletes.column("id").to_pylist() == [A]
    upserts = pq.read_table(out / "_bulkembed" / "changes" / "upserts")
    assert upserts.column("id").to_pylist() == [B]
    summary = _summary(out / "_bulkembed")
    assert (summary["new"], summary["deleted"], summary["bad_records"]) == (1, 1, 0)


def test_a_synced_table_takes_the_twin_and_later_edits_of_the_first(
    tmp_path, tiny_st, texts, vectors
):
    import lancedb

    model = tiny_st("mean")
    uri = f"lancedb://{tmp_path / 'db'}?table=docs"
    corpus = tmp_path / "corpus" / "c.jsonl"
    versions = [
        [{"id": A, "text": texts[0]}, {"id": "c", "text": texts[2]}],
        [{"id": A, "text": texts[0]}, {"id": B, "text": texts[1]}, {"id": "c", "text": texts[2]}],
        [{"id": A, "text": texts[3]}, {"id": B, "text": texts[1]}, {"id": "c", "text": texts[2]}],
    ]
    for number, records in enumerate(versions):
        write_jsonl(corpus, records)
        since = ("--since", uri) if number else ()
        result = run_cli(corpus.parent, model, uri, *SETTINGS, *since)
        assert result.exit_code == 0, result.output
        table = lancedb.connect(tmp_path / "db").open_table("docs").to_arrow()
        table = table.take(pc.sort_indices(table, [("id", "ascending")]))
        expected = {r["id"]: vectors[texts.index(r["text"])] for r in records}
        _assert_vectors(_rows(table), expected)

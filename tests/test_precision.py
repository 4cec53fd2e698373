"""`--dtype auto`: a fast dtype is kept only if a sample of the corpus agrees with float32."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import records, run_cli, write_jsonl

from bulkembed import devices, precision
from bulkembed.encoders import Embeddings, SparseVector


def _embed(tmp_path, model, out, *extra):
    """Embed 100 sample documents into `tmp_path/out`: the table and the summary."""
    corpus = write_jsonl(tmp_path / "c.jsonl", records(100, prefix="d"))
    result = run_cli(corpus, model, tmp_path / out, *extra)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / out / "_bulkembed" / "summary.json").read_text())
    return pq.read_table(tmp_path / out), summary


def test_auto_falls_back_to_float32_when_the_fast_dtype_breaks_parity(
    tmp_path, tiny_st, monkeypatch
):
    model = tiny_st("mean")
    reference, _ = _embed(tmp_path, model, "float32", "--dtype", "float32")
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", 1.5)  # no dtype can pass
    table, summary = _embed(tmp_path, model, "auto")
    assert summary["dtype"] == "float32"
    assert summary["dtype_check"].startswith("bfloat16 against float32 on 64 document(s)")
    assert summary["dtype_check"].endswith("below 1.5: running in float32")
    assert table.equals(reference)


def test_auto_keeps_the_fast_dtype_when_it_agrees(tmp_path, tiny_st, monkeypatch):
    model = tiny_st("mean")
    reference, _ = _embed(tmp_path, model, "float32", "--dtype", "float32")
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", 0.9)
    table, summary = _embed(tmp_path, model, "auto")
    assert summary["dtype"] == "bfloat16"
    assert summary["dtype_check"].endswith(", kept")
    fast = np.array(table.column("dense").to_pylist())
    exact = np.array(reference.column("dense").to_pylist())
    assert not np.array_equal(fast, exact)
    assert (fast * exact).sum(axis=1).min() > 0.9


def test_float32_cpus_run_no_check(tmp_path, tiny_st, monkeypatch):
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: False)
    _, summary = _embed(tmp_path, tiny_st("mean"), "auto")
    assert (summary["dtype"], summary["dtype_check"]) == ("float32", None)


def test_lowest_cosine_covers_every_output():
    dense = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    tilted = np.array([[1.0, 0.0], [0.1, 2.0]], dtype=np.float32)
    assert precision.lowest_cosine(Embeddings(dense), Embeddings(dense)) == pytest.approx(1.0)
    assert precision.lowest_cosine(Embeddings(dense), Embeddings(tilted)) == pytest.approx(
        2 / np.sqrt(4.01)
    )
    a = SparseVector(np.array([1, 5]), np.array([1.0, 1.0]))
    b = SparseVector(np.array([1, 7]), np.array([1.0, 1.0]))
    assert precision.lowest_cosine(Embeddings(sparse=[a]), Embeddings(sparse=[b])) == pytest.approx(
        0.5
    )
    tokens = [np.eye(3, dtype=np.float32)]
    assert precision.lowest_cosine(
        Embeddings(multivector=tokens), Embeddings(multivector=[np.eye(3)[::-1].copy()])
    ) == pytest.approx(0.0)
    assert (
        precision.lowest_cosine(Embeddings(multivector=tokens), Embeddings(multivector=[np.eye(2)]))
        == 0.0
    )

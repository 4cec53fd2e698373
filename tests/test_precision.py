"""`--dtype auto`: a fast dtype is kept only if a sample of the corpus agrees with float32."""

import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import read_output, records, run_cli, write_jsonl

from bulkembed.contracts import SparseRows
from bulkembed.encoders import Embeddings, Encoder, SparseVector, decisions
from bulkembed.engine import precision
from bulkembed.models import devices


def _embed(tmp_path, model, out, *extra, shown=None):
    """Embed 100 sample documents into `tmp_path/out`: the table and the summary; what the
    run printed goes into `shown`."""
    corpus = write_jsonl(tmp_path / "c.jsonl", records(100, prefix="d"))
    result = run_cli(corpus, model, tmp_path / out, *extra)
    assert result.exit_code == 0, result.output
    if shown is not None:
        shown.append(result.output)
    summary = json.loads((tmp_path / out / "_bulkembed" / "summary.json").read_text())
    return pq.read_table(tmp_path / out), summary


def test_auto_falls_back_to_float32_when_the_fast_dtype_breaks_parity(
    tmp_path, tiny_st, monkeypatch
):
    model = tiny_st("mean")
    reference, _ = _embed(tmp_path, model, "float32", "--dtype", "float32")
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", 1.5)  # no dtype can pass
    shown = []
    table, summary = _embed(tmp_path, model, "auto", "--quiet", shown=shown)
    assert summary["dtype"] == "float32"
    # Even with --quiet: when the check fails, and again as the run ends.
    warnings = [line for line in shown[0].splitlines() if line.startswith("warning:")]
    assert [w.split(":")[1].strip() for w in warnings] == [
        "--dtype auto",
        "this run computed in float32",
    ]
    assert re.fullmatch(
        r"bfloat16 against float32 on 64 documents: lowest dense cosine [01]\.\d{7}; "
        r"below 1\.5: running in float32, several times slower "
        r"\(--dtype bfloat16 keeps bfloat16 without the check\)",
        summary["dtype_check"],
    )
    assert table.equals(reference)


def test_auto_keeps_the_fast_dtype_when_it_agrees(tmp_path, tiny_st, monkeypatch):
    model = tiny_st("mean")
    # PyTorch computes in bfloat16 on any CPU; OpenVINO only where the CPU has bfloat16.
    torch = ("--backend", "torch")
    reference, _ = _embed(tmp_path, model, "float32", "--dtype", "float32", *torch)
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", 0.9)
    table, summary = _embed(tmp_path, model, "auto", *torch)
    assert summary["dtype"] == "bfloat16"
    assert summary["dtype_check"].endswith("; kept")
    fast = np.array(table.column("dense").to_pylist())
    exact = np.array(reference.column("dense").to_pylist())
    assert not np.array_equal(fast, exact)
    assert (fast * exact).sum(axis=1).min() > 0.9


def test_a_recorded_check_is_taken_by_later_runs_with_the_same_key(tmp_path, tiny_st, monkeypatch):
    model = tiny_st("mean")
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", 0.9)
    checks = []
    check_on_window = precision.check_on_window

    def counted(*arguments):
        checks.append(1)
        return check_on_window(*arguments)

    monkeypatch.setattr(precision, "check_on_window", counted)
    first, summary = _embed(tmp_path, model, "first")
    assert len(checks) == 1 and summary["dtype_check"].endswith("; kept")
    again, summary = _embed(tmp_path, model, "again")
    assert len(checks) == 1, "the recorded check is taken"
    assert summary["dtype"] == "bfloat16"
    recorded = "; kept (recorded by an earlier run of this model on this device)"
    assert summary["dtype_check"] == summary["dtype_check"].split(";")[0] + recorded
    # The sample is embedded as the check embedded it: the same output, to the bit.
    assert again.equals(first)
    # Another setting of the model, another device: checked again.
    _embed(tmp_path, model, "shorter", "--max-length", "16")
    assert len(checks) == 2
    monkeypatch.setattr(decisions, "device_identity", lambda device: "another cpu")
    _embed(tmp_path, model, "elsewhere")
    assert len(checks) == 3
    # A failed check is recorded too: the next run computes in float32 with no check.
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", 1.5)
    _embed(tmp_path, model, "failed", "--max-length", "20")
    assert len(checks) == 4
    shown = []
    _, summary = _embed(tmp_path, model, "failed-again", "--max-length", "20", shown=shown)
    assert len(checks) == 4 and summary["dtype"] == "float32"
    assert "warning: --dtype auto: bfloat16 against float32" in shown[0]
    failed = pq.read_table(tmp_path / "failed")
    assert pq.read_table(tmp_path / "failed-again").equals(failed)


def test_float32_cpus_run_no_check(tmp_path, tiny_st, monkeypatch):
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: False)
    _, summary = _embed(tmp_path, tiny_st("mean"), "auto")
    assert (summary["dtype"], summary["dtype_check"]) == ("float32", None)


def test_dense_vectors_must_all_agree_and_the_others_at_the_first_percentile():
    dense = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    tilted = np.array([[1.0, 0.0], [0.1, 2.0]], dtype=np.float32)
    assert precision.agreement(Embeddings(dense), Embeddings(dense)).dense == pytest.approx(1.0)
    found = precision.agreement(Embeddings(dense), Embeddings(tilted))
    assert (found.dense, found.others) == (pytest.approx(2 / np.sqrt(4.01)), None)
    a = SparseRows.of([SparseVector(np.array([1, 5]), np.array([1.0, 1.0]))])
    b = SparseRows.of([SparseVector(np.array([1, 7]), np.array([1.0, 1.0]))])
    found = precision.agreement(Embeddings(sparse=a), Embeddings(sparse=b))
    assert (found.dense, found.others) == (None, pytest.approx(0.5))
    # 200 token vectors, one of them turned round: the 1st percentile still agrees.
    tokens = np.eye(200, dtype=np.float32)
    turned = tokens.copy()
    turned[7] = -turned[7]
    found = precision.agreement(Embeddings(multivector=[tokens]), Embeddings(multivector=[turned]))
    assert found.others == pytest.approx(1.0) and found.worst == pytest.approx(1.0)
    # Three of them: it does not.
    turned[8], turned[9] = -turned[8], -turned[9]
    found = precision.agreement(Embeddings(multivector=[tokens]), Embeddings(multivector=[turned]))
    assert found.others < 0
    # Each output on its own: agreeing token vectors do not hide a sparse output that differs.
    found = precision.agreement(
        Embeddings(multivector=[tokens], sparse=a), Embeddings(multivector=[tokens], sparse=b)
    )
    assert found.others == pytest.approx(0.5)
    # A document with another number of token vectors disagrees entirely.
    found = precision.agreement(
        Embeddings(multivector=[np.eye(3)]), Embeddings(multivector=[np.eye(2)])
    )
    assert found.others == 0.0


@pytest.mark.parametrize(("threshold", "kept"), [(0.9, "bfloat16"), (1.5, "float32")])
@pytest.mark.parametrize("documents", [100, 40])
def test_the_check_s_sample_is_not_embedded_again(
    tmp_path, tiny_st, monkeypatch, threshold, kept, documents
):
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", threshold)
    asked = {"float32": 0, "bfloat16": 0}
    upload = Encoder.upload

    def counted_upload(encoder, batch):
        asked[str(encoder.dtype).removeprefix("torch.")] += len(batch)
        return upload(encoder, batch)

    monkeypatch.setattr(Encoder, "upload", counted_upload)
    checks = []
    check_on_window = precision.check_on_window

    def kept_check(*arguments):
        checks.append(check_on_window(*arguments))
        return checks[-1]

    monkeypatch.setattr(precision, "check_on_window", kept_check)
    corpus = write_jsonl(tmp_path / "c.jsonl", records(documents, prefix="d"))
    result = run_cli(corpus, tiny_st("mean"), tmp_path / "out")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "_bulkembed" / "summary.json").read_text())
    assert (summary["dtype"], summary["docs_this_run"]) == (kept, documents)
    # Each document once in the dtype kept; the sample once more, in the other dtype.
    sample = min(documents, precision.SAMPLE_DOCUMENTS)
    other = "float32" if kept == "bfloat16" else "bfloat16"
    assert asked == {kept: documents, other: sample}
    # The sample's rows are the vectors the check computed in the dtype kept.
    [checked] = checks
    assert str(checked.encoder.dtype) == f"torch.{kept}" and len(checked.sample) == sample
    rows = read_output(tmp_path / "out")
    assert len(rows) == documents
    written = np.array([rows[f"d{i}"] for i in range(sample)], dtype=np.float32)
    assert np.array_equal(written, checked.sample.vectors.dense)


def test_device_seconds_count_the_run_s_batches_not_the_check_before_them(
    tmp_path, tiny_st, monkeypatch
):
    from bulkembed.encoders import transfer
    from bulkembed.engine import run

    # Each batch that lands "took" one device second; those of the check are told apart.
    landed = {"check": 0, "run": 0}
    checking = []
    monkeypatch.setattr(devices, "cpu_accelerates_bfloat16", lambda: True)
    monkeypatch.setattr(precision, "PARITY_THRESHOLD", 0.9)
    check_on_window = precision.check_on_window

    def timed_check(*arguments, **options):
        checking.append(True)
        try:
            return check_on_window(*arguments, **options)
        finally:
            checking.pop()

    def busy_seconds(self):
        landed["check" if checking else "run"] += 1
        return 1.0

    counted = []
    summarize = run.summarize

    def summarized(done, stats, *rest):
        counted.append(stats.counts.busy_seconds)
        return summarize(done, stats, *rest)

    monkeypatch.setattr(precision, "check_on_window", timed_check)
    monkeypatch.setattr(transfer.Landing, "busy_seconds", busy_seconds)
    monkeypatch.setattr(run, "summarize", summarized)
    _, summary = _embed(tmp_path, tiny_st("mean"), "out", "--backend", "torch")
    assert summary["dtype"] == "bfloat16"
    assert landed["check"] > 0 and landed["run"] > 0
    assert counted == [float(landed["run"])]

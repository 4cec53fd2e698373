"""`--since`: only new and changed documents reach the model; the output equals a full run."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import (
    content_hash,
    incremental_corpora,
    record_calls,
    run_cli,
    sample_texts,
    write_jsonl,
)

from bulkembed.encoders.base import Encoder

# float32 on every CPU, so that vectors compare at float32 precision across runs.
FLOAT32 = ("--dtype", "float32")


def _summary(out):
    return json.loads((out / "_bulkembed" / "summary.json").read_text())


def _count_model_documents(monkeypatch):
    """Documents passed through the model, counted at the encoder."""
    return record_calls(monkeypatch, Encoder, "launch", lambda _, inputs: len(inputs.batch))


def test_incremental_run_embeds_only_new_and_changed_documents(tmp_path, tiny_st, monkeypatch):
    model = tiny_st("mean")
    incremental_corpora(tmp_path)
    assert run_cli(tmp_path / "v1", model, tmp_path / "out-v1", *FLOAT32).exit_code == 0

    model_documents = _count_model_documents(monkeypatch)
    result = run_cli(
        tmp_path / "v2", model, tmp_path / "out-v2", "--since", tmp_path / "out-v1", *FLOAT32
    )
    assert result.exit_code == 0, result.output
    assert sum(model_documents) == 8
    summary = _summary(tmp_path / "out-v2")
    counts = {k: summary[k] for k in ("new", "changed", "unchanged", "deleted", "docs")}
    assert counts == {"new": 3, "changed": 5, "unchanged": 993, "deleted": 2, "docs": 1001}
    assert summary["docs_this_run"] == 8
    assert 0 < summary["encode_seconds"] < summary["seconds"]
    assert 0 < summary["device_idle_fraction"] < 1

    monkeypatch.undo()
    assert run_cli(tmp_path / "v2", model, tmp_path / "full", *FLOAT32).exit_code == 0
    incremental = pq.read_table(tmp_path / "out-v2")
    full = pq.read_table(tmp_path / "full")
    assert incremental.column("id").to_pylist() == full.column("id").to_pylist()
    assert incremental.column("content_hash").equals(full.column("content_hash"))
    np.testing.assert_allclose(
        np.array(incremental.column("dense").to_pylist()),
        np.array(full.column("dense").to_pylist()),
        atol=1e-6,
    )


def test_content_hash_covers_the_prompt(tmp_path, tiny_st):
    records = [{"id": "a", "text": "some text"}]
    write_jsonl(tmp_path / "c.jsonl", records)
    assert (
        run_cli(
            tmp_path / "c.jsonl", tiny_st("mean"), tmp_path / "o", "--prompt", "query: ", *FLOAT32
        ).exit_code
        == 0
    )
    table = pq.read_table(tmp_path / "o")
    assert table.column("content_hash").to_pylist() == [content_hash("query: some text")]
    assert content_hash("query: some text") != content_hash("some text")


def _flip_a_vector_bit(part) -> None:
    """Change one bit of the first dense float of `part` on disk, as a failing disk would."""
    first = pq.read_table(part).column("dense")[0].values.to_numpy()
    data = bytearray(part.read_bytes())
    where = data.find(first.tobytes())
    assert where > 0 and data.count(first.tobytes()) == 1
    data[where] ^= 0x40
    part.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["cut", "gone", "flipped", "flipped-changed"])
def test_a_damaged_previous_output_stops_since_naming_the_part(tmp_path, tiny_st, damage):
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(30))]
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    model = tiny_st("mean")
    units = ("--records-per-unit", "10")
    assert run_cli(corpus, model, tmp_path / "prev", *FLOAT32, *units).exit_code == 0
    part = sorted((tmp_path / "prev").glob("*.parquet"))[1]
    if damage == "cut":
        part.write_bytes(part.read_bytes()[:300])
    elif damage == "gone":
        part.unlink()
    else:
        # A changed bit in a plain float reads as another float: only its page's checksum
        # tells, whether the part would be copied whole or its rows read one by one.
        _flip_a_vector_bit(part)
        if damage == "flipped-changed":
            records[12]["text"] += " changed"
            corpus = write_jsonl(tmp_path / "c.jsonl", records)
    since = ("--since", tmp_path / "prev")
    result = run_cli(corpus, model, tmp_path / "new", *FLOAT32, *units, *since)
    assert result.exit_code == 1
    message = result.output.strip()
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith(
        f"error: --since: cannot read {part}, a part of the previous output ("
    )
    assert message.endswith(
        "): restore it from a copy, or run without --since to embed every document again"
    )
    if damage.startswith("flipped"):
        assert "CRC checksum verification failed" in message
        # Units committed before the damaged one are kept for the rerun; none after it.
        assert part.name not in {p.name for p in (tmp_path / "new").glob("*.parquet")}


def test_since_refuses_an_output_made_with_other_settings(tmp_path, tiny_st):
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(20))]
    write_jsonl(tmp_path / "c.jsonl", records)
    model = tiny_st("mean")
    assert (
        run_cli(
            tmp_path / "c.jsonl", model, tmp_path / "old", "--max-length", "32", *FLOAT32
        ).exit_code
        == 0
    )
    result = run_cli(
        tmp_path / "c.jsonl", model, tmp_path / "new", "--since", tmp_path / "old", *FLOAT32
    )
    assert result.exit_code == 2
    assert "was made with other settings (--max-length: 32 -> 64)" in result.output
    assert "run without --since" in result.output
    result = run_cli(
        tmp_path / "c.jsonl", model, tmp_path / "new", "--since", tmp_path / "nowhere", *FLOAT32
    )
    assert result.exit_code == 2 and "not a bulkembed output directory" in result.output
    result = run_cli(
        tmp_path / "c.jsonl", model, tmp_path / "old", "--since", tmp_path / "old", *FLOAT32
    )
    assert result.exit_code == 2 and "--since must name another output" in result.output


def test_since_refuses_an_unfinished_output(tmp_path, tiny_st):
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(20))]
    write_jsonl(tmp_path / "c.jsonl", records)
    model = tiny_st("mean")
    assert run_cli(tmp_path / "c.jsonl", model, tmp_path / "old", *FLOAT32).exit_code == 0
    (tmp_path / "old" / "_bulkembed" / "complete").unlink()
    result = run_cli(
        tmp_path / "c.jsonl", model, tmp_path / "new", "--since", tmp_path / "old", *FLOAT32
    )
    assert result.exit_code == 2 and "that run is unfinished" in result.output


@pytest.mark.parametrize("output", ["multivector", "sparse"])
def test_carried_rows_keep_every_output_column(tmp_path, tiny_bge_m3, output):
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(40))]
    write_jsonl(tmp_path / "v1.jsonl", records)
    records[5]["text"] = "a different text"
    write_jsonl(tmp_path / "v2.jsonl", records)
    options = ("--outputs", f"dense,{output}")
    assert (
        run_cli(tmp_path / "v1.jsonl", tiny_bge_m3, tmp_path / "old", *options, *FLOAT32).exit_code
        == 0
    )
    result = run_cli(
        tmp_path / "v2.jsonl",
        tiny_bge_m3,
        tmp_path / "new",
        *options,
        "--since",
        tmp_path / "old",
        *FLOAT32,
    )
    assert result.exit_code == 0, result.output
    assert (
        run_cli(tmp_path / "v2.jsonl", tiny_bge_m3, tmp_path / "full", *options, *FLOAT32).exit_code
        == 0
    )
    new, full = pq.read_table(tmp_path / "new"), pq.read_table(tmp_path / "full")
    assert new.column("id").equals(full.column("id"))
    assert _summary(tmp_path / "new")["changed"] == 1
    for a, b in zip(new.column(output).to_pylist(), full.column(output).to_pylist(), strict=True):
        if output == "sparse":
            assert a["indices"] == b["indices"]
            np.testing.assert_allclose(a["values"], b["values"], atol=1e-5)
        else:
            np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5)


def test_rows_stay_in_input_order_when_chunks_are_split(tmp_path, tiny_st):
    """Small batch budgets cut chunks into pieces: carried rows go with the right piece."""
    model = tiny_st("mean")
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(600))]
    write_jsonl(tmp_path / "v1.jsonl", records)
    for record in records[:100]:
        record["text"] += " (edited)"
    write_jsonl(tmp_path / "v2.jsonl", records)
    budget = ("--max-batch-tokens", "64")
    assert run_cli(tmp_path / "v1.jsonl", model, tmp_path / "old", *budget, *FLOAT32).exit_code == 0
    since = ("--since", tmp_path / "old")
    assert (
        run_cli(tmp_path / "v2.jsonl", model, tmp_path / "new", *budget, *since, *FLOAT32).exit_code
        == 0
    )
    ids = pq.read_table(tmp_path / "new").column("id").to_pylist()
    assert ids == [r["id"] for r in records]
    assert _summary(tmp_path / "new")["changed"] == 100


def test_quantized_outputs_share_the_previous_scale(tmp_path, tiny_st):
    model = tiny_st("mean")
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(50))]
    write_jsonl(tmp_path / "v1.jsonl", records)
    records[7]["text"] += " (edited)"  # a single document to embed: too few to calibrate
    write_jsonl(tmp_path / "v2.jsonl", records)
    quantize = ("--quantize", "int8")
    assert (
        run_cli(tmp_path / "v1.jsonl", model, tmp_path / "old", *quantize, *FLOAT32).exit_code == 0
    )
    result = run_cli(
        tmp_path / "v2.jsonl",
        model,
        tmp_path / "new",
        *quantize,
        "--since",
        tmp_path / "old",
        *FLOAT32,
    )
    assert result.exit_code == 0, result.output
    scale = "_bulkembed/quantization.json"
    assert (tmp_path / "new" / scale).read_text() == (tmp_path / "old" / scale).read_text()
    old, new = pq.read_table(tmp_path / "old"), pq.read_table(tmp_path / "new")
    unchanged = [i for i in range(50) if i != 7]
    assert new.take(unchanged).column("dense").equals(old.take(unchanged).column("dense"))
    assert new.column("dense")[7] != old.column("dense")[7]


def test_limit_leaves_the_deleted_count_unknown(tmp_path, tiny_st):
    model = tiny_st("mean")
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(30))]
    write_jsonl(tmp_path / "c.jsonl", records)
    assert run_cli(tmp_path / "c.jsonl", model, tmp_path / "old", *FLOAT32).exit_code == 0
    since = ("--since", tmp_path / "old", "--limit", "10")
    assert run_cli(tmp_path / "c.jsonl", model, tmp_path / "new", *since, *FLOAT32).exit_code == 0
    summary = _summary(tmp_path / "new")
    assert (summary["unchanged"], summary["deleted"]) == (10, None)


def test_a_finished_incremental_run_does_not_read_the_previous_output_again(tmp_path, tiny_st):
    import shutil

    model = tiny_st("mean")
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(30))]
    write_jsonl(tmp_path / "c.jsonl", records)
    assert run_cli(tmp_path / "c.jsonl", model, tmp_path / "old", *FLOAT32).exit_code == 0
    since = ("--since", tmp_path / "old")
    assert run_cli(tmp_path / "c.jsonl", model, tmp_path / "new", *since, *FLOAT32).exit_code == 0
    shutil.rmtree(tmp_path / "old")
    again = run_cli(tmp_path / "c.jsonl", model, tmp_path / "new", *since, *FLOAT32)
    assert again.exit_code == 0, again.output
    assert _summary(tmp_path / "new")["unchanged"] == 30


def _count_tokenized_texts(monkeypatch):
    """Texts passed through the tokenizer (`--tokenize-workers 0`: in this process)."""
    from bulkembed.batching.tokenize import TextTokenizer

    return record_calls(
        monkeypatch, TextTokenizer, "_encoded", lambda _, inputs, *_cut: len(inputs)
    )


def _drop_row_counts(out):
    """Rewrite each part of `out` as an older bulkembed wrote it: no rows' counts in its
    label."""
    for path in sorted(out.glob("part-*.parquet")):
        table = pq.read_table(path)
        metadata = dict(table.schema.metadata)
        label = json.loads(pq.read_metadata(path).metadata[b"bulkembed.unit"])
        del label["counts"]
        metadata[b"bulkembed.unit"] = json.dumps(label).encode()
        pq.write_table(table.replace_schema_metadata(metadata), path)


@pytest.mark.parametrize("labelled", [True, False], ids=["with-counts", "older-parts"])
def test_carried_texts_are_not_tokenized_and_keep_their_counts(
    tmp_path, tiny_st, monkeypatch, labelled
):
    model = tiny_st("mean")
    incremental_corpora(tmp_path)
    # `run_cli` tokenizes in this process, where the tokenizer's calls are counted.
    options = ("--max-length", "16", *FLOAT32)
    assert run_cli(tmp_path / "v1", model, tmp_path / "out-v1", *options).exit_code == 0
    if not labelled:
        _drop_row_counts(tmp_path / "out-v1")
    assert run_cli(tmp_path / "v2", model, tmp_path / "full", *options).exit_code == 0

    tokenized = _count_tokenized_texts(monkeypatch)
    since = ("--since", tmp_path / "out-v1")
    assert run_cli(tmp_path / "v2", model, tmp_path / "out-v2", *since, *options).exit_code == 0
    # The 3 new and 5 changed texts; with older parts, the 993 unchanged ones too.
    assert sum(tokenized) == (8 if labelled else 1001)
    full, incremental = _summary(tmp_path / "full"), _summary(tmp_path / "out-v2")
    assert incremental["unchanged"] == 993
    assert 0 < full["truncated"] < full["docs"]
    for key in ("tokens", "truncated", "docs"):
        assert incremental[key] == full[key], key

    # The counts travel on: a run against the incremental output tokenizes nothing.
    tokenized.clear()
    since = ("--since", tmp_path / "out-v2")
    assert run_cli(tmp_path / "v2", model, tmp_path / "out-v3", *since, *options).exit_code == 0
    assert sum(tokenized) == 0
    again = _summary(tmp_path / "out-v3")
    assert (again["tokens"], again["truncated"]) == (full["tokens"], full["truncated"])


def test_a_run_with_nothing_to_embed_loads_no_model(tmp_path, tiny_st, monkeypatch):
    from bulkembed.engine import in_process

    model = tiny_st("mean")
    incremental_corpora(tmp_path)
    assert run_cli(tmp_path / "v1", model, tmp_path / "out-v1", *FLOAT32).exit_code == 0
    sessions = []
    start_session = in_process.start_session

    def counting(*args, **kwargs):
        sessions.append(args)
        return start_session(*args, **kwargs)

    monkeypatch.setattr(in_process, "start_session", counting)
    since = ("--since", tmp_path / "out-v1")
    result = run_cli(tmp_path / "v1", model, tmp_path / "same", *since, *FLOAT32)
    assert result.exit_code == 0, result.output
    assert sessions == []
    summary = _summary(tmp_path / "same")
    assert (summary["unchanged"], summary["docs_embedded"]) == (1000, 0)
    same, before = pq.read_table(tmp_path / "same"), pq.read_table(tmp_path / "out-v1")
    assert same.column("id").equals(before.column("id"))
    assert same.column("dense").equals(before.column("dense"))
    assert pq.read_schema(next((tmp_path / "same").glob("part-*.parquet"))).equals(
        pq.read_schema(next((tmp_path / "out-v1").glob("part-*.parquet"))), check_metadata=True
    )

    # With documents to embed, the model loads when the first of them comes.
    result = run_cli(tmp_path / "v2", model, tmp_path / "out-v2", *since, *FLOAT32)
    assert result.exit_code == 0, result.output
    assert len(sessions) == 1
    assert _summary(tmp_path / "out-v2")["docs_embedded"] == 8


def test_since_an_output_without_rows_embeds_every_document_as_new(tmp_path, tiny_st):
    model = tiny_st("mean")
    incremental_corpora(tmp_path)
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"id": "a", "text": None}])
    assert run_cli(empty, model, tmp_path / "none", *FLOAT32).exit_code == 0
    since = ("--since", tmp_path / "none")
    result = run_cli(tmp_path / "v1", model, tmp_path / "out", *since, *FLOAT32)
    assert result.exit_code == 0, result.output
    summary = _summary(tmp_path / "out")
    assert (summary["new"], summary["unchanged"], summary["docs"]) == (1000, 0, 1000)

"""Bad input is set aside with a reason, counted, and never stops or crashes the run."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
from helpers import read_output, run_cli, sample_texts, write_parquet
from typer.testing import CliRunner

runner = CliRunner()

JSONL_LINES = [
    b'{"id": "a1", "text": "fine text"}',
    b'{"id": "a2", "text": nope}',
    b'{"id": "a3", "text": null}',
    b'{"id": "a4", "text": 42}',
    b'{"id": "a5", "body": "no text field here"}',
    b'{"id": "a6", "text": "caf\xe9"}',
    b'{"id": "a7", "text": ""}',
    b'{"id": "a8", "text": "' + b"word " * 5000 + b'"}',
    b'{"id": "a1", "text": "the same id again"}',
    b'{"id": "a10", "text": "lone \\ud800 surrogate"}',
    b'{"id": "a11", "text": "last line"}',
]


def _bad_corpus(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_bytes(b"\n".join(JSONL_LINES) + b"\n")
    write_parquet(
        corpus / "b.parquet",
        [{"id": "b0", "text": "fine"}, {"id": "b1", "text": None}, {"id": "b2", "text": "ok"}],
    )
    (corpus / "c.parquet").write_bytes(b"this is not a parquet file at all")
    whole = pa.Table.from_pylist(
        [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(40))]
    )
    pq.write_table(whole, corpus / "whole.parquet")
    data = (corpus / "whole.parquet").read_bytes()
    (corpus / "whole.parquet").unlink()
    (corpus / "d.parquet").write_bytes(data[: len(data) // 2])
    lines = "".join(
        json.dumps({"id": f"e{i}", "text": t}) + "\n" for i, t in enumerate(sample_texts(400))
    )
    packed = gzip.compress(lines.encode())
    (corpus / "e.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    return corpus


def test_every_kind_of_bad_input_is_quarantined_and_the_rest_embedded(tmp_path, tiny_st):
    corpus = _bad_corpus(tmp_path)
    out = tmp_path / "out"
    result = run_cli(corpus, tiny_st("mean"), out)
    assert result.exit_code == 0, result.output

    bad = [
        json.loads(x) for x in (out / "_bulkembed" / "bad_records.jsonl").read_text().splitlines()
    ]
    found = {
        (b["source"].rsplit("/", 1)[-1], b.get("line", b.get("row"))): b["reason"] for b in bad
    }
    expected_prefixes = {
        ("a.jsonl", 2): "malformed JSON",
        ("a.jsonl", 3): "text is null",
        ("a.jsonl", 4): "text is of type int, not a string",
        ("a.jsonl", 5): "no 'text' field",
        ("a.jsonl", 6): "invalid UTF-8 at byte 25",
        ("a.jsonl", 9): "duplicate id",
        ("a.jsonl", 10): "text holds an unpaired surrogate",
        ("b.parquet", 1): "text is null",
        ("c.parquet", None): "unreadable Parquet file",
        ("d.parquet", None): "unreadable Parquet file",
    }
    for key, prefix in expected_prefixes.items():
        assert found.pop(key).startswith(prefix), key
    [(gz_key, gz_reason)] = found.items()
    assert gz_key[0] == "e.jsonl.gz" and gz_reason.startswith("unreadable after line ")
    lines_read = int(gz_reason.split()[3].rstrip(":"))
    assert 0 < lines_read < 400

    vectors = read_output(out)
    expected_ids = {"a1", "a7", "a8", "a11", "b0", "b2"} | {f"e{i}" for i in range(lines_read)}
    assert set(vectors) == expected_ids
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    assert summary["bad_records"] == 11 == len(bad)
    assert summary["docs"] == len(expected_ids)
    assert summary["truncated"] >= 1


def test_fail_mode_stops_at_the_first_bad_record_naming_file_and_line(tmp_path, tiny_st):
    corpus = _bad_corpus(tmp_path)
    result = run_cli(corpus, tiny_st("mean"), tmp_path / "out", "--on-bad-record", "fail")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        f"error: bad record at {corpus.resolve()}/a.jsonl line 2: malformed JSON"
    )


def test_limit_does_not_report_bad_records_past_it(tmp_path, tiny_st):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "one"}\n{broken\n{"text": "two"}\n{"text": null}\n')
    out = tmp_path / "out"
    assert run_cli(corpus, tiny_st("mean"), out, "--limit", "1").exit_code == 0
    assert list(read_output(out)) == ["c.jsonl:0"]
    assert not (out / "_bulkembed" / "bad_records.jsonl").exists()


def test_an_all_null_parquet_text_column_is_quarantined_row_by_row(tmp_path, tiny_st):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"id": ["x", "y"], "text": pa.array([None, None], pa.null())}), path)
    out = tmp_path / "out"
    assert run_cli(path, tiny_st("mean"), out).exit_code == 0
    bad = (out / "_bulkembed" / "bad_records.jsonl").read_text().splitlines()
    assert [json.loads(b)["id"] for b in bad] == ["x", "y"]


def test_mixed_integer_and_string_ids_become_strings_and_collisions_are_duplicates(
    tmp_path, tiny_st
):
    write_parquet(
        tmp_path / "c" / "a.parquet", [{"id": 1, "text": "one"}, {"id": 2, "text": "two"}]
    )
    (tmp_path / "c" / "b.jsonl").write_text(
        '{"id": "1", "text": "one again"}\n{"id": 3, "text": "three"}\n'
    )
    out = tmp_path / "out"
    assert run_cli(tmp_path / "c", tiny_st("mean"), out).exit_code == 0
    table = pq.read_table(out)
    assert table.schema.field("id").type == pa.string()
    assert sorted(table.column("id").to_pylist()) == ["1", "2", "3"]
    [bad] = (out / "_bulkembed" / "bad_records.jsonl").read_text().splitlines()
    assert json.loads(bad)["line"] == 1 and "duplicate id" in json.loads(bad)["reason"]


def test_output_inside_the_input_directory_is_not_read_back(tmp_path, tiny_st):
    corpus = tmp_path / "c"
    (corpus).mkdir()
    (corpus / "a.jsonl").write_text('{"id": "x", "text": "hello"}\n')
    out = corpus / "embeddings"
    assert run_cli(corpus, tiny_st("mean"), out).exit_code == 0
    assert run_cli(corpus, tiny_st("mean"), out, "--overwrite").exit_code == 0
    assert list(read_output(out)) == ["x"]
    assert (corpus / "a.jsonl").exists()


def test_foreign_parquet_files_in_the_output_are_never_deleted(tmp_path, tiny_st):
    corpus = tmp_path / "a.jsonl"
    corpus.write_text('{"id": "x", "text": "hello"}\n')
    out = tmp_path / "out"
    write_parquet(out / "mine.parquet", [{"a": 1}])
    result = run_cli(corpus, tiny_st("mean"), out, "--overwrite")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: {out} holds Parquet files that bulkembed did not write (mine.parquet): "
        "readers of the output would take them for parts; choose another --output"
    )
    assert (out / "mine.parquet").exists()

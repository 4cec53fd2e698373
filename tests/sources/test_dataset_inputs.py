"""Datasets saved with `datasets`, `hf://` inputs, Arrow files, and passthrough columns."""

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import (
    cosines,
    fill_the_disk_at_commit,
    run_cli,
    sample_texts,
    write_jsonl,
    write_parquet,
)
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.sources import RecordReader, list_inputs
from bulkembed.sources.hf import parse_dataset_name

ORIGINAL_CLOSE = pq.ParquetWriter.close


def _records(n=300):
    return [{"id": f"doc-{i}", "text": t} for i, t in enumerate(sample_texts(n))]


def _embed(inputs, model, out, *extra):
    arguments = ["run", *map(str, inputs), "--model", str(model), "--output", str(out), "-q"]
    result = CliRunner().invoke(app, [*arguments, "--tokenize-workers", "0", *extra])
    assert result.exit_code == 0, result.output
    return pq.read_table(out)


def _columns(table):
    """Every column, rows in id order."""
    table = table.sort_by("id")
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _assert_same_rows(found, expected):
    """The same ids and texts, and the same vectors up to float rounding: inputs cut into
    other units pack other batches, whose neighbours change a vector's last bits."""
    found, expected = _columns(found), _columns(expected)
    assert found.keys() == expected.keys()
    assert found["id"] == expected["id"]
    assert found["content_hash"] == expected["content_hash"]
    assert cosines(found["dense"], expected["dense"]).min() >= 0.99999


def test_saved_dataset_embeds_to_the_same_vectors_as_parquet(tmp_path, tiny_st):
    records = _records()
    model = tiny_st("mean")
    write_parquet(tmp_path / "plain" / "data.parquet", records, row_group_size=100)
    dataset = datasets.Dataset.from_list(records)
    dataset.save_to_disk(tmp_path / "saved", max_shard_size="60KB")
    assert len(list((tmp_path / "saved").glob("*.arrow"))) > 1
    parquet = _embed([tmp_path / "plain"], model, tmp_path / "out-parquet")
    saved = _embed([tmp_path / "saved"], model, tmp_path / "out-saved")
    _assert_same_rows(saved, parquet)
    summary = json.loads((tmp_path / "out-saved" / "_bulkembed" / "summary.json").read_text())
    assert summary["bad_records"] == 0  # state.json and dataset_info.json are not input


def test_local_hf_path_streams_to_the_same_vectors_as_parquet(tmp_path, tiny_st):
    records = _records()
    model = tiny_st("mean")
    write_parquet(tmp_path / "hub-like" / "train.parquet", records[:200], row_group_size=64)
    write_parquet(tmp_path / "hub-like" / "train-2.parquet", records[200:], row_group_size=64)
    write_parquet(tmp_path / "plain" / "data.parquet", records, row_group_size=100)
    parquet = _embed([tmp_path / "plain"], model, tmp_path / "out-parquet")
    streamed = _embed([f"hf://{tmp_path / 'hub-like'}:train"], model, tmp_path / "out-hf")
    _assert_same_rows(streamed, parquet)


def test_dataset_dict_folder_reads_every_split(tmp_path, tiny_st):
    records = _records(40)
    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(records[:30]),
            "test": datasets.Dataset.from_list(records[30:]),
        }
    )
    splits.save_to_disk(tmp_path / "splits")
    out = _embed([tmp_path / "splits"], tiny_st("mean"), tmp_path / "out")
    assert sorted(out.column("id").to_pylist()) == sorted(r["id"] for r in records)
    only_test = _embed([tmp_path / "splits" / "test"], tiny_st("mean"), tmp_path / "out-test")
    assert only_test.column("id").to_pylist() == [r["id"] for r in records[30:]]


def test_arrow_units_are_fixed_row_ranges_and_resume_skips_done_ones(tmp_path):
    records = _records(25)
    datasets.Dataset.from_list(records).save_to_disk(tmp_path / "saved")
    files = list_inputs([str(tmp_path / "saved")])
    reader = RecordReader(files, chunk_size=4, records_per_unit=10)
    chunks = list(reader.read())
    assert [(c.unit, len(c.texts), c.last_in_unit) for c in chunks] == [
        (0, 4, False), (0, 4, False), (0, 2, True),
        (1, 4, False), (1, 4, False), (1, 2, True),
        (2, 4, False), (2, 1, True),
    ]  # fmt: skip
    assert chunks[3].positions.tolist() == [10, 11, 12, 13]
    skip = {"part-00000-000001"}
    ids = [i for c in reader.read(skip) for i in c.ids.to_pylist()]
    assert ids == [r["id"] for r in records[:10] + records[20:]]


def test_hf_names_are_parsed(tmp_path):
    (tmp_path / "local").mkdir()
    assert parse_dataset_name("hf://org/name").label == "hf://org/name:train"
    assert parse_dataset_name("hf://org/name/en:validation").label == (
        "hf://org/name/en:validation"
    )
    local = parse_dataset_name(f"hf://{tmp_path / 'local'}:test")
    assert (local.name, local.config, local.split) == (str(tmp_path / "local"), None, "test")


def test_unknown_hf_dataset_is_a_one_line_error(tmp_path, tiny_st):
    arguments = ["run", "hf://no-such-org/no-such-dataset", "--model", str(tiny_st("mean"))]
    result = CliRunner().invoke(app, [*arguments, "--output", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "error: cannot open hf://no-such-org/no-such-dataset:train" in result.output


def test_keep_columns_are_copied_from_every_kind_of_input(tmp_path, tiny_st):
    records = [{**r, "title": f"title {i}", "year": 2000 + i} for i, r in enumerate(_records(30))]
    records[25]["year"] = "twenty"  # does not fit the column's type: quarantined
    del records[26]["title"]  # a JSON field may be missing: null
    write_parquet(tmp_path / "corpus" / "a.parquet", records[:10], row_group_size=4)
    datasets.Dataset.from_list(records[10:20]).save_to_disk(tmp_path / "corpus" / "saved")
    write_jsonl(tmp_path / "corpus" / "c.jsonl", records[20:])
    out = _embed(
        [tmp_path / "corpus"], tiny_st("mean"), tmp_path / "out", "--keep-columns", "year,title"
    )
    assert out.schema.names == ["id", "dense", "content_hash", "year", "title"]
    assert out.schema.field("year").type == pa.int64()
    kept = {
        r["id"]: (r["year"], r["title"]) for r in out.select(["id", "year", "title"]).to_pylist()
    }
    expected = {r["id"]: (r.get("year"), r.get("title")) for r in records}
    del expected["doc-25"]
    assert kept == expected
    bad = (tmp_path / "out" / "_bulkembed" / "bad_records.jsonl").read_text().splitlines()
    assert len(bad) == 1
    assert json.loads(bad[0])["reason"].startswith(
        "--keep-columns 'year' holds str 'twenty', which does not fit the column's type int64"
    )


def test_keep_columns_errors_say_what_to_do(tmp_path, tiny_st):
    write_parquet(tmp_path / "a.parquet", _records(5))
    arguments = ["run", str(tmp_path / "a.parquet"), "--model", str(tiny_st("mean"))]
    arguments += ["--output", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*arguments, "--keep-columns", "title"])
    assert result.exit_code == 1
    assert "--keep-columns 'title' not found in" in result.output
    result = CliRunner().invoke(app, [*arguments, "--keep-columns", "text,dense"])
    assert "--keep-columns: dense is a column bulkembed writes itself" in result.output
    result = CliRunner().invoke(app, [*arguments, "--fts"])
    assert "--index and --fts apply to an output that keeps indexes" in result.output


@pytest.mark.parametrize(
    ("kinds", "unified"),
    [
        ((pa.int32(), pa.int64()), pa.int64()),
        ((pa.int64(), pa.float32()), pa.float64()),
        ((pa.large_string(), pa.string()), pa.string()),
        ((pa.string(), pa.int64()), None),
    ],
)
def test_passthrough_types_must_agree_across_files(tmp_path, kinds, unified):
    for name, kind in zip("ab", kinds, strict=True):
        table = pa.table({"text": ["x"], "n": pa.array([1], pa.int64()).cast(kind)})
        pq.write_table(table, tmp_path / f"{name}.parquet")
    reader = RecordReader(list_inputs([str(tmp_path)]), keep_columns=("n",))
    if unified is None:
        with pytest.raises(Exception, match="--keep-columns 'n' is string in one input and int64"):
            reader.check()
        return
    reader.check()
    assert reader.column_types == {"n": unified}
    assert [c.columns["n"].type for c in reader.read()] == [unified, unified]


@pytest.mark.parametrize("kind", ["saved", "hf"])
def test_a_dataset_run_resumes_after_its_done_units(tmp_path, tiny_st, monkeypatch, kind):
    """900 records: three units of 410 records; the first run dies at the second commit."""
    texts = sample_texts(300)
    records = [{"id": f"d{i}", "text": f"{texts[i % 300][:100]} {i}"} for i in range(900)]
    if kind == "saved":
        datasets.Dataset.from_list(records).save_to_disk(tmp_path / "data")
        source = tmp_path / "data"
    else:
        write_parquet(tmp_path / "data" / "train.parquet", records)
        source = f"hf://{tmp_path / 'data'}"
    model, unit = tiny_st("mean"), ("--records-per-unit", "410")
    reference = _embed([source], model, tmp_path / "reference", *unit)
    fill_the_disk_at_commit(monkeypatch, 2)
    failed = run_cli(source, model, tmp_path / "out", *unit)
    assert failed.exit_code == 1 and "No space left on device" in failed.output
    monkeypatch.setattr(pq.ParquetWriter, "close", ORIGINAL_CLOSE)
    resumed = _embed([source], model, tmp_path / "out", *unit)
    summary = json.loads((tmp_path / "out" / "_bulkembed" / "summary.json").read_text())
    assert (summary["units"], summary["docs_this_run"]) == (3, 900 - 410)
    assert _columns(resumed)["id"] == sorted(r["id"] for r in records)
    _assert_same_rows(resumed, reference)


def test_arrow_ipc_files_and_streams_both_read(tmp_path):
    table = pa.table({"id": ["a", "b", "c"], "text": ["x", "y", "z"]})
    with pa.ipc.new_file(tmp_path / "file.arrow", table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    with pa.ipc.new_stream(tmp_path / "stream.arrow", table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    for name in ("file.arrow", "stream.arrow"):
        reader = RecordReader(list_inputs([str(tmp_path / name)]))
        assert [i for c in reader.read() for i in c.ids.to_pylist()] == ["a", "b", "c"]


def test_passthrough_values_that_cannot_be_kept_set_their_record_aside(tmp_path, tiny_st):
    write_jsonl(
        tmp_path / "corpus" / "a.jsonl",
        [{"id": f"j{i}", "text": "json text", "n": i} for i in range(3)],
    )
    (tmp_path / "corpus" / "b.jsonl").write_text(
        '{"id": "j3", "text": "t", "n": 1, "title": "ok"}\n'
        '{"id": "j4", "text": "t", "n": 2, "title": "bad \\ud800"}\n'
        '{"id": "bad \\ud800", "text": "t", "n": 3}\n'
    )
    big = 2**60 + 1  # no float64 holds it exactly
    parquet = pa.table({"id": ["p0", "p1"], "text": ["a", "b"], "n": [5, big], "title": ["p", "q"]})
    pq.write_table(parquet, tmp_path / "corpus" / "c.parquet")
    floats = pa.table({"id": ["f0"], "text": ["c"], "n": [0.5], "title": pa.nulls(1, pa.null())})
    pq.write_table(floats, tmp_path / "corpus" / "d.parquet")
    out = _embed([tmp_path / "corpus"], tiny_st("mean"), tmp_path / "out", "--keep-columns", "n")
    assert out.schema.field("n").type == pa.float64()  # int64 and double inputs
    assert sorted(out.column("id").to_pylist()) == ["f0", "j0", "j1", "j2", "j3", "j4", "p0"]
    reasons = sorted(
        json.loads(line)["reason"]
        for line in (tmp_path / "out" / "_bulkembed" / "bad_records.jsonl").read_text().splitlines()
    )
    assert reasons[0].startswith("--keep-columns 'n' holds 1152921504606846977, which does not fit")
    assert reasons[1] == "id holds an unpaired surrogate, not valid Unicode"
    titled = _embed(
        [tmp_path / "corpus"], tiny_st("mean"), tmp_path / "out-title", "--keep-columns", "title"
    )
    assert titled.schema.field("title").type == pa.string()  # a null column takes any type
    bad = (tmp_path / "out-title" / "_bulkembed" / "bad_records.jsonl").read_text()
    assert "'title' holds text with an unpaired surrogate, not valid Unicode" in bad


def test_a_json_field_that_starts_late_still_gets_its_type(tmp_path, tiny_st):
    records = [{"id": f"d{i}", "text": f"text {i}"} for i in range(200)]
    for record in records[150:]:
        record["year"] = 1900 + int(record["id"][1:])
    write_jsonl(tmp_path / "c.jsonl", records)
    out = _embed(
        [tmp_path / "c.jsonl"], tiny_st("mean"), tmp_path / "out", "--keep-columns", "year"
    )
    assert out.schema.field("year").type == pa.int64()
    years = dict(zip(out.column("id").to_pylist(), out.column("year").to_pylist(), strict=True))
    assert (len(years), years["d0"], years["d199"]) == (200, None, 2099)
    arguments = ["run", str(tmp_path / "c.jsonl"), "--model", str(tiny_st("mean"))]
    result = CliRunner().invoke(
        app, [*arguments, "-o", str(tmp_path / "o2"), "--keep-columns", "yaer"]
    )
    assert result.exit_code == 1
    assert "--keep-columns 'yaer' has a value in no record of the inputs" in result.output

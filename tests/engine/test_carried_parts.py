"""`--since`: a unit whose rows are a part of the previous output whole, in order, is
committed as a copy of that part with this run's label; any other unit is written row by
row, its carried vectors read from the previous output when it is written."""

import json
import struct

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import incremental_corpora, record_calls, records, run_cli, write_parquet

from bulkembed.run_dir import RunDirectory
from bulkembed.sources.records import PreviousRows

FLOAT32 = ("--dtype", "float32")


def _data_pages(path) -> bytes:
    """A Parquet file's bytes before its footer."""
    data = path.read_bytes()
    (length,) = struct.unpack("<I", data[-8:-4])
    return data[: len(data) - 8 - length]


def _label(path) -> dict:
    return json.loads(pq.read_metadata(path).metadata[b"bulkembed.unit"])


def _summary(out):
    return json.loads((out / "_bulkembed" / "summary.json").read_text())


def _count_reads(monkeypatch) -> list[tuple[int, int]]:
    """The rows read from the previous output by the writer, as (start, stop)."""
    return record_calls(monkeypatch, PreviousRows, "read", lambda rows, _: (rows.start, rows.stop))


def test_unchanged_units_are_copies_of_the_previous_parts(tmp_path, tiny_st, monkeypatch):
    model = tiny_st("mean")
    incremental_corpora(tmp_path)
    before = tmp_path / "out-v1"
    assert run_cli(tmp_path / "v1", model, before, *FLOAT32).exit_code == 0
    reads = _count_reads(monkeypatch)
    same = tmp_path / "same"
    result = run_cli(tmp_path / "v1", model, same, "--since", before, *FLOAT32)
    assert result.exit_code == 0, result.output
    assert reads == []
    run_id = json.loads((same / "_bulkembed" / "config.json").read_text())["run"]
    parts = sorted(p.name for p in same.glob("part-*.parquet"))
    assert parts == sorted(p.name for p in before.glob("part-*.parquet"))
    assert len(parts) == 7
    for name in parts:
        assert _data_pages(same / name) == _data_pages(before / name)
        label, earlier = _label(same / name), _label(before / name)
        assert label["run"] == run_id != earlier["run"]
        assert label["counts"] == earlier["counts"]
        assert label["unit"]["carried"] == label["unit"]["rows"] == earlier["unit"]["rows"]
    assert pq.read_table(same).equals(pq.read_table(before))
    assert (_summary(same)["unchanged"], _summary(same)["docs_embedded"]) == (1000, 0)

    # A copied part whose done-marker is lost is taken back from its label.
    (same / "_bulkembed" / "done" / f"{parts[2].removesuffix('.parquet')}.json").unlink()
    (same / "_bulkembed" / "complete").unlink()
    result = run_cli(tmp_path / "v1", model, same, "--since", before, *FLOAT32)
    assert result.exit_code == 0, result.output
    assert reads == []
    assert RunDirectory(same).is_complete()
    assert _data_pages(same / parts[2]) == _data_pages(before / parts[2])
    assert pq.read_table(same).equals(pq.read_table(before))


def test_a_unit_changed_after_its_first_chunk_reads_the_carried_rows(
    tmp_path, tiny_st, monkeypatch
):
    model = tiny_st("mean")
    old = records(1000)
    new = [dict(r) for r in old]
    new[900]["text"] += " (edited)"
    # One unit (one row group) of several chunks: those before row 900 are unchanged.
    write_parquet(tmp_path / "v1" / "a.parquet", old, row_group_size=1000)
    write_parquet(tmp_path / "v2" / "a.parquet", new, row_group_size=1000)
    assert run_cli(tmp_path / "v1", model, tmp_path / "out-v1", *FLOAT32).exit_code == 0
    reads = _count_reads(monkeypatch)
    since = ("--since", tmp_path / "out-v1")
    result = run_cli(tmp_path / "v2", model, tmp_path / "out-v2", *since, *FLOAT32)
    assert result.exit_code == 0, result.output
    # The unchanged chunks' rows, read when the changed one came.
    assert reads[0][0] == 0 and 0 < reads[-1][1] <= 900
    assert all(end == start for (_, end), (start, _) in zip(reads, reads[1:], strict=False))
    assert _summary(tmp_path / "out-v2")["docs_embedded"] == 1
    name = "part-00000-000000.parquet"
    assert _data_pages(tmp_path / "out-v2" / name) != _data_pages(tmp_path / "out-v1" / name)

    monkeypatch.undo()
    assert run_cli(tmp_path / "v2", model, tmp_path / "full", *FLOAT32).exit_code == 0
    incremental, full = pq.read_table(tmp_path / "out-v2"), pq.read_table(tmp_path / "full")
    assert incremental.column("id").to_pylist() == [r["id"] for r in new]
    assert incremental.column("content_hash").equals(full.column("content_hash"))
    np.testing.assert_allclose(
        np.array(incremental.column("dense").to_pylist()),
        np.array(full.column("dense").to_pylist()),
        atol=1e-6,
    )


@pytest.mark.parametrize("change", ["title", "none"])
def test_kept_columns_come_from_the_input(tmp_path, tiny_st, change, monkeypatch):
    from bulkembed.sinks.parquet import ParquetSink

    model = tiny_st("mean")
    adopted = record_calls(monkeypatch, ParquetSink, "adopt", lambda _, part, *rest: part)
    old = [{**r, "title": f"title {n}"} for n, r in enumerate(records(300))]
    new = [dict(r) for r in old]
    if change == "title":
        new[7]["title"] = "a new title"
    write_parquet(tmp_path / "v1" / "a.parquet", old, row_group_size=100)
    write_parquet(tmp_path / "v2" / "a.parquet", new, row_group_size=100)
    keep = ("--keep-columns", "title")
    assert run_cli(tmp_path / "v1", model, tmp_path / "out-v1", *keep, *FLOAT32).exit_code == 0
    since = ("--since", tmp_path / "out-v1")
    result = run_cli(tmp_path / "v2", model, tmp_path / "out-v2", *since, *keep, *FLOAT32)
    assert result.exit_code == 0, result.output
    # A part with passthrough columns is never taken whole: they come from the input.
    assert adopted == []
    table = pq.read_table(tmp_path / "out-v2")
    assert table.column("title").to_pylist() == [r["title"] for r in new]
    assert table.column("dense").equals(pq.read_table(tmp_path / "out-v1").column("dense"))


def test_parts_of_another_bulkembed_version_are_written_row_by_row(tmp_path, tiny_st, monkeypatch):
    model = tiny_st("mean")
    incremental_corpora(tmp_path)
    before = tmp_path / "out-v1"
    assert run_cli(tmp_path / "v1", model, before, *FLOAT32).exit_code == 0
    for part in before.glob("part-*.parquet"):
        table = pq.read_table(part)
        metadata = {**table.schema.metadata, b"bulkembed.version": b"0.0.1"}
        label = pq.read_metadata(part).metadata[b"bulkembed.unit"]
        writer = pq.ParquetWriter(part, table.schema.with_metadata(metadata))
        writer.write_table(table)
        writer.add_key_value_metadata({"bulkembed.unit": label})
        writer.close()
    reads = _count_reads(monkeypatch)
    same = tmp_path / "same"
    result = run_cli(tmp_path / "v1", model, same, "--since", before, *FLOAT32)
    assert result.exit_code == 0, result.output
    # Not deferred: their vectors are read as they are carried, never a row at a time later.
    assert reads == []
    for name in (p.name for p in same.glob("part-*.parquet")):
        assert pq.read_schema(same / name).metadata[b"bulkembed.version"] != b"0.0.1"
    assert pq.read_table(same).column("dense").equals(pq.read_table(before).column("dense"))

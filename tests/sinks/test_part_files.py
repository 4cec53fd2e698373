"""A part copied with a new label: the same data pages, a footer with one entry replaced."""

import json
import struct

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulkembed.sinks.part_files import FooterError, copy_with_entry
from bulkembed.sources.records import PreviousRows

LABEL = "bulkembed.unit"


def _write(path, entries: dict[str, str]) -> pa.Table:
    """A file of 1,000 rows in row groups of 128, with statistics, nulls, a vector column
    and `entries` in its footer (20 of them and more take the long list header)."""
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "id": [f"doc-{i}" for i in range(1000)],
            "dense": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(1000 * 8, dtype=np.float32)), 8
            ),
            "score": pa.array([None if i % 7 == 0 else i * 0.5 for i in range(1000)]),
        }
    ).replace_schema_metadata({"bulkembed.model": "m"})
    writer = pq.ParquetWriter(path, table.schema)
    for batch in table.to_batches(max_chunksize=128):
        writer.write_batch(batch)
    writer.add_key_value_metadata(entries)
    writer.close()
    return table


def _data_pages(path) -> bytes:
    data = path.read_bytes()
    (length,) = struct.unpack("<I", data[-8:-4])
    return data[: len(data) - 8 - length]


@pytest.mark.parametrize("count", [1, 20])
def test_the_copy_holds_the_same_pages_and_the_new_entry(tmp_path, count):
    entries = {f"key-{n}": f"value-{n}" for n in range(count - 1)}
    entries[LABEL] = json.dumps({"run": "before"})
    source, copy = tmp_path / "source.parquet", tmp_path / "copy.parquet"
    table = _write(source, entries)
    label = json.dumps({"run": "after", "bad": ["x" * 300]})
    copy_with_entry(source, copy, LABEL, label)

    assert _data_pages(copy) == _data_pages(source)
    metadata = pq.read_metadata(copy).metadata
    assert metadata[LABEL.encode()] == label.encode()
    assert {k: v for k, v in metadata.items() if k != LABEL.encode()} == {
        k: v for k, v in pq.read_metadata(source).metadata.items() if k != LABEL.encode()
    }
    assert len(metadata) == count + 2  # with ARROW:schema and the schema's bulkembed.model
    read = pq.read_table(copy)
    assert read.equals(table)
    assert read.schema.metadata == {b"bulkembed.model": b"m"}
    assert (
        pq.ParquetFile(copy).metadata.row_group(3).column(2).statistics.max == 255.0
    )  # row 511 is null
    # Another reader takes the new footer too.
    found = duckdb.sql(f"SELECT count(*), count(score), max(id) FROM '{copy}'").fetchall()[0]
    assert found == (1000, 857, "doc-999")


def test_a_footer_without_the_entry_or_a_file_that_is_not_parquet_is_refused(tmp_path):
    source, copy = tmp_path / "source.parquet", tmp_path / "copy.parquet"
    _write(source, {"other": "1"})
    with pytest.raises(FooterError, match="no entry bulkembed.unit"):
        copy_with_entry(source, copy, LABEL, "{}")
    (tmp_path / "text.parquet").write_text("not a Parquet file, but long enough to look")
    with pytest.raises(FooterError, match="not a plain Parquet file"):
        copy_with_entry(tmp_path / "text.parquet", copy, LABEL, "{}")
    cut = tmp_path / "cut.parquet"
    data = source.read_bytes()
    (length,) = struct.unpack("<I", data[-8:-4])
    # The footer's last 40 bytes gone, its length and magic kept.
    cut.write_bytes(data[: len(data) - 48] + data[-8:])
    with pytest.raises(FooterError):
        copy_with_entry(cut, copy, LABEL, "{}")


def test_previous_rows_are_read_across_row_groups(tmp_path):
    source = tmp_path / "source.parquet"
    table = _write(source, {LABEL: "{}"})
    for start, stop in [(0, 128), (5, 300), (127, 129), (900, 1000), (0, 1000)]:
        read = PreviousRows(source, start, stop).read(["id", "dense"])
        assert read.equals(table.select(["id", "dense"]).slice(start, stop - start))

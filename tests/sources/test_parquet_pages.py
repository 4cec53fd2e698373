"""A giant row group's text column read a page at a time gives what pyarrow reads, its long
texts cut where they lie and hashed whole, whatever the pages' compression, encoding and
version; a layout it does not read is left to pyarrow."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import content_hash, sample_texts

from bulkembed.sources import RecordReader, list_inputs, parquet_pages
from bulkembed.sources.long_texts import TextCut

CUT = TextCut(300)


def _texts(nulls: bool) -> list[str | None]:
    texts: list[str | None] = [t[:200] for t in sample_texts(120)]
    texts[7] = "é" * 1_000 + " long " * 400  # cut
    texts[50] = "x" * 301  # cut, one character past the bound
    texts[51] = "y" * 300  # not cut
    texts[90] = "ü" * 299  # more bytes than the bound, not cut
    if nulls:
        texts[3] = texts[60] = None
    return texts


def _expected(texts: list[str | None]) -> tuple[list[str | None], list[str]]:
    cut = [t if t is None or len(t) <= 300 else t[:300] for t in texts]
    hashes = [content_hash(t) if t is not None and len(t) > 300 else "" for t in texts]
    return cut, hashes


LAYOUTS = list(
    itertools.product(
        ["snappy", "zstd", "gzip", "none"], [True, False], ["1.0", "2.0"], [False, True]
    )
)


@pytest.mark.parametrize(("compression", "dictionary", "version", "nulls"), LAYOUTS)
def test_pages_read_as_pyarrow_reads_them(tmp_path, compression, dictionary, version, nulls):
    texts = _texts(nulls)
    table = pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": texts})
    path = tmp_path / "t.parquet"
    pq.write_table(
        table,
        path,
        compression=compression,
        use_dictionary=dictionary,
        data_page_version=version,
        data_page_size=2_000,  # many pages
        row_group_size=1_000,
    )
    parquet = pq.ParquetFile(path)
    column = parquet.metadata.row_group(0).column(1)
    definition = parquet.schema.column(1).max_definition_level
    with pa.OSFile(str(path)) as source:
        found = parquet_pages.read_texts(source, column, definition, CUT)
    cut, hashes = _expected(texts)
    assert found.texts == cut
    assert [bytes(h).hex() for h in found.hashes] == hashes


def test_a_layout_it_does_not_read_is_left_to_pyarrow(tmp_path):
    table = pa.table({"text": _texts(False)})
    path = tmp_path / "t.parquet"
    encoded = {"text": "DELTA_LENGTH_BYTE_ARRAY"}
    pq.write_table(table, path, use_dictionary=False, column_encoding=encoded)
    parquet = pq.ParquetFile(path)
    with pa.OSFile(str(path)) as source, pytest.raises(parquet_pages.Unreadable):
        parquet_pages.read_texts(source, parquet.metadata.row_group(0).column(0), 1, CUT)


@pytest.mark.parametrize("layout", ["dictionary", "plain", "delta"])
def test_a_giant_row_group_reads_as_any_other(tmp_path, monkeypatch, layout):
    texts = _texts(True)
    table = pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": texts})
    path = tmp_path / "t.parquet"
    options = {
        "dictionary": {},
        "plain": {"use_dictionary": False},
        "delta": {"use_dictionary": False, "column_encoding": {"text": "DELTA_LENGTH_BYTE_ARRAY"}},
    }[layout]
    pq.write_table(table, path, row_group_size=50, **options)

    def read(giant: int):
        monkeypatch.setattr(parquet_pages, "GIANT", giant)
        monkeypatch.setattr("bulkembed.sources.parquet.GIANT", giant)
        chunks = list(RecordReader(list_inputs([str(path)]), text_cut=CUT).read())
        hashes: list[str] = []
        for chunk in chunks:
            found = [bytes(h).hex() for h in chunk.hashes]
            hashes += found if len(found) else [""] * len(chunk)
        return (
            [i for c in chunks for i in c.ids.to_pylist()],
            [t for c in chunks for t in c.texts.to_pylist()],
            [(b.row, b.reason) for c in chunks for b in c.bad],
            hashes,
        )

    by_pages, by_pyarrow = read(0), read(1 << 40)
    assert by_pages == by_pyarrow
    ids, cut, bad, hashes = by_pages
    expected_cut, expected_hashes = _expected([t for t in texts if t is not None])
    assert cut == expected_cut and hashes == expected_hashes
    assert bad == [(3, "text is null"), (60, "text is null")]
    assert len(ids) == len(texts) - 2

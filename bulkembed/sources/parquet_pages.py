"""A row group's text column read page by page, a giant text cut where it lies.

pyarrow decodes a row group's column whole: a text of 1 GB costs its compressed page, the
page decompressed and the array built from it at once, about 4 GB. A text column far
larger than any text the model reads (`GIANT` bytes in a row group) is read here instead:
each page is decompressed alone (`pyarrow.decompress`), and each value is taken from the
page's bytes where it lies: a long one is cut and hashed there (`long_texts.TextCut`), the
page let go before the next. A text of 1 GB then costs its compressed and decompressed
page, and what the reader keeps of it.

Pages are read as the Parquet format lays them out: a header (Thrift's compact protocol),
then the page; dictionary pages and data pages (versions 1 and 2) of a flat column of byte
arrays, nullable or not, PLAIN or dictionary encoded. Anything else (another encoding, a
nested column, a page the header does not describe so) raises `Unreadable`, and pyarrow
reads the row group as it does the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from bulkembed.sources.long_texts import TextCut

# A row group whose text column holds more than this, uncompressed, is read here.
GIANT = 16 << 20
_HEADER_BYTES = 1 << 16
_CODECS: dict[str, str | None] = {"SNAPPY": "snappy", "GZIP": "gzip", "ZSTD": "zstd"}
_CODECS |= {"LZ4_RAW": "lz4_raw", "BROTLI": "brotli", "UNCOMPRESSED": None}
_DATA, _DICTIONARY, _DATA_V2 = 0, 2, 3
_PLAIN, _PLAIN_DICTIONARY, _RLE, _RLE_DICTIONARY = 0, 2, 3, 8


class Unreadable(Exception):
    """A column chunk laid out in a way this reader does not read."""


@dataclass(frozen=True, slots=True)
class Texts:
    """A column's values: each text (cut where long, None where null) and, for a cut one,
    its content hash (else zero)."""

    texts: list[str | None]
    hashes: np.ndarray


def read_texts(source: Any, column: Any, max_definition: int, cut: TextCut) -> Texts:
    """The values of the column chunk `column` (row-group column metadata) of the open
    Parquet file `source` (pyarrow's random-access file)."""
    if column.physical_type != "BYTE_ARRAY" or column.compression not in _CODECS:
        raise Unreadable(f"a {column.physical_type} column, {column.compression}")
    if max_definition > 1:
        raise Unreadable("a nested column")
    codec = _CODECS[column.compression]
    start = column.dictionary_page_offset or column.data_page_offset
    end = start + column.total_compressed_size
    dictionary: list[tuple[str, bytes]] = []
    texts: list[str | None] = []
    hashes: list[bytes] = []
    for kind, header, page in _pages(source, start, end, codec):
        if kind == _DICTIONARY:
            dictionary = list(_plain(page, header[7][1], cut))
            continue
        values, nulls = _data_values(kind, header, page, max_definition, codec)
        encoding = header[5][2] if kind == _DATA else header[8][4]
        if encoding == _PLAIN:
            found = list(_plain(values, len(nulls) - int(nulls.sum()), cut))
        elif encoding in (_PLAIN_DICTIONARY, _RLE_DICTIONARY):
            indices = _hybrid(values[1:], values[0], len(nulls) - int(nulls.sum()))
            found = [dictionary[int(i)] for i in indices]
        else:
            raise Unreadable(f"values encoded as {encoding}")
        taken = iter(found)
        for null in nulls.tolist():
            text, digest = (None, b"") if null else next(taken)
            texts.append(text)
            hashes.append(digest)
    return Texts(texts, np.array(hashes, dtype="S16"))


def _pages(
    source: Any, start: int, end: int, codec: str | None
) -> Iterator[tuple[int, dict[int, Any], pa.Buffer]]:
    """(type, header, bytes) of each page from `start` to `end`: the bytes of a dictionary
    or version 1 data page decompressed, those of a version 2 one as they are stored."""
    at = start
    while at < end:
        raw = source.read_at(min(_HEADER_BYTES, end - at), at)
        try:
            header, size = _struct(memoryview(raw), 0)
        except IndexError:
            raise Unreadable("a page header longer than read") from None
        kind, stored, whole = header.get(1), header.get(3), header.get(2)
        if kind not in (_DATA, _DICTIONARY, _DATA_V2) or stored is None or whole is None:
            raise Unreadable(f"a page of type {kind}")
        page = source.read_at(stored, at + size)
        if kind != _DATA_V2 and codec is not None:
            page = pa.decompress(page, decompressed_size=whole, codec=codec)
        yield kind, header, page
        at += size + stored


def _data_values(
    kind: int, header: dict[int, Any], page: pa.Buffer, max_definition: int, codec: str | None
) -> tuple[memoryview, np.ndarray]:
    """A data page's encoded values, and which of its entries are null."""
    if kind == _DATA:
        count = header[5][1]
        data = memoryview(page)
        if max_definition == 0:
            return data, np.zeros(count, dtype=bool)
        size = int.from_bytes(data[:4], "little")
        levels = _hybrid(data[4 : 4 + size], 1, count)
        return data[4 + size :], levels == 0
    fields = header[8]
    count, repetition, definition = fields[1], fields[6], fields[5]
    if repetition:
        raise Unreadable("repeated values")
    data = memoryview(page)
    levels = _hybrid(data[:definition], 1, count) if max_definition else np.ones(count)
    values = data[definition:]
    if fields.get(7, True) and codec is not None:
        whole = header[2] - definition
        values = memoryview(pa.decompress(values, decompressed_size=whole, codec=codec))
    return values, levels == 0


def _plain(data: memoryview, count: int, cut: TextCut) -> Iterator[tuple[str, bytes]]:
    """The first `count` PLAIN byte arrays of `data`, as texts, cut where long."""
    at = 0
    for _ in range(count):
        size = int.from_bytes(data[at : at + 4], "little")
        value = data[at + 4 : at + 4 + size]
        at += 4 + size
        try:
            yield cut.text_of(value)
        except ValueError:
            raise Unreadable("a value that is not UTF-8") from None


def _hybrid(data: memoryview, width: int, count: int) -> np.ndarray:
    """`count` values of `width` bits from the RLE / bit-packed hybrid encoding."""
    if width == 0:
        return np.zeros(count, dtype=np.int64)
    found: list[np.ndarray] = []
    total, at = 0, 0
    width_bytes = (width + 7) // 8
    while total < count:
        header, at = _varint(data, at)
        if header & 1:
            groups = header >> 1
            size = groups * width
            bits = np.unpackbits(np.frombuffer(data[at : at + size], np.uint8), bitorder="little")
            values = bits.reshape(-1, width) @ (1 << np.arange(width, dtype=np.int64))
            at += size
        else:
            value = int.from_bytes(data[at : at + width_bytes], "little")
            values = np.full(header >> 1, value, dtype=np.int64)
            at += width_bytes
        found.append(values)
        total += len(values)
    return np.concatenate(found)[:count] if found else np.empty(0, np.int64)


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _zigzag(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def _struct(data: memoryview, at: int) -> tuple[dict[int, Any], int]:
    """A Thrift compact-protocol struct from `at`: its fields by id (integers, binaries,
    structs; lists skipped), and where it ends."""
    fields: dict[int, Any] = {}
    last = 0
    while True:
        byte = data[at]
        at += 1
        if byte == 0:
            return fields, at
        kind, delta = byte & 0x0F, byte >> 4
        if delta:
            last += delta
        else:
            raw, at = _varint(data, at)
            last = _zigzag(raw)
        fields[last], at = _value(data, at, kind)


def _value(data: memoryview, at: int, kind: int) -> tuple[Any, int]:
    if kind in (1, 2):
        return kind == 1, at
    if kind == 3:
        return data[at], at + 1
    if kind in (4, 5, 6):
        raw, at = _varint(data, at)
        return _zigzag(raw), at
    if kind == 7:
        return None, at + 8
    if kind == 8:
        size, at = _varint(data, at)
        return bytes(data[at : at + size]), at + size
    if kind in (9, 10):
        header = data[at]
        at += 1
        size, element = header >> 4, header & 0x0F
        if size == 15:
            size, at = _varint(data, at)
        for _ in range(size):
            _, at = _value(data, at, element)
        return None, at
    if kind == 12:
        return _struct(data, at)
    raise Unreadable(f"a Thrift field of type {kind}")

"""What a part's file holds beyond its rows: how its columns are encoded, its label, and a
copy of it with another label.

Embedding columns are written plain: no dictionary, no statistics, no compression. Vectors
of floats gain nothing from any of them, and skipping them doubles the speed of writing
float32 multi-vectors and triples it for float16 (see the host-ceiling figures in
docs/benchmarks.md).
Ids and content hashes, each one of a kind, are written without a dictionary (the hashes
without statistics); passthrough columns keep pyarrow's defaults. Every page carries a CRC32
of its bytes, which every read of a part by bulkembed verifies (`storage.parquet_file`): a
plain float changed on disk would otherwise read as another vector, with no error.

A part's footer carries its label: the id of the run that wrote it and the content of its
unit's done-marker. A part carried over whole from a previous output (`--since`, a unit
whose every row is unchanged) holds the same bytes as that output's part but for its
label. Copying the file and writing a new footer costs a copy, where reading and writing
its rows costs decoding and encoding them. The footer is Parquet's `FileMetaData`, a
Thrift struct in the compact protocol, followed by its length (4 bytes, little-endian) and
`PAR1`. Its field 5 is the list of key-value entries; the fields around it are copied byte
for byte: every field is read only to find where it ends.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bulkembed.schema import CONTENT_HASH, EMBEDDING_COLUMNS

if TYPE_CHECKING:
    import pyarrow.parquet as pq

    from bulkembed.storage import AnyPath

# The footer key of a part's label.
LABEL_KEY = "bulkembed.unit"
MAGIC = b"PAR1"
# FileMetaData's field holding the key-value entries.
_KEY_VALUES = 5
# Compact-protocol type codes.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE = 1, 2, 3, 4, 5, 6, 7
_BINARY, _LIST, _SET, _MAP, _STRUCT, _UUID = 8, 9, 10, 11, 12, 13


def part_path(directory: AnyPath, part: str) -> AnyPath:
    """Where the Parquet part of unit `part` is in an output `directory`."""
    return directory / f"{part}.parquet"


def part_label(metadata: pq.FileMetaData) -> dict[str, Any] | None:
    """The label in a part's footer metadata, with the part's `rows`; None if it has none
    (bulkembed did not write it) or it is not a JSON object."""
    label = (metadata.metadata or {}).get(LABEL_KEY.encode())
    if label is None:
        return None
    try:
        found = json.loads(label)
    except json.JSONDecodeError:
        return None
    if not isinstance(found, dict):
        return None
    found["rows"] = metadata.num_rows
    return found


def leaf_paths(name: str, kind: pa.DataType) -> list[str]:
    """The Parquet column paths of an Arrow field, as pyarrow writes them (lists in the
    compliant nested layout, `name.list.element`).

    >>> leaf_paths("sparse", pa.struct([("indices", pa.list_(pa.int32()))]))
    ['sparse.indices.list.element']
    """
    if pa.types.is_struct(kind):
        return [p for child in kind for p in leaf_paths(f"{name}.{child.name}", child.type)]
    if pa.types.is_map(kind):
        entries = f"{name}.key_value"
        return leaf_paths(f"{entries}.key", kind.key_type) + leaf_paths(
            f"{entries}.value", kind.item_type
        )
    if isinstance(kind, pa.ListType | pa.LargeListType | pa.FixedSizeListType):
        return leaf_paths(f"{name}.list.element", kind.value_type)
    return [name]


def writer_options(schema: pa.Schema) -> dict[str, Any]:
    """`ParquetWriter` options for parts of `schema`: the leaf columns of the embeddings
    plain (no dictionary, statistics or compression); ids and content hashes, one of a kind
    each, without a dictionary (and the hashes without statistics); the others as pyarrow's
    defaults."""
    paths = [p for field in schema for p in leaf_paths(field.name, field.type)]
    others = [p for p in paths if p.split(".")[0] not in EMBEDDING_COLUMNS]
    return {
        "use_dictionary": [p for p in others if p not in ("id", CONTENT_HASH)],
        "write_statistics": [p for p in others if p != CONTENT_HASH],
        "compression": {p: "snappy" if p in others else "none" for p in paths},
        "write_page_checksum": True,
    }


def pages_intact(source: Path) -> bool:
    """Whether every page of the Parquet file `source` reads and matches its checksum (a
    page written without one only has to read), a row group at a time."""
    import pyarrow.parquet as pq

    try:
        found = pq.ParquetFile(source, page_checksum_verification=True)
        for group in range(found.num_row_groups):
            found.read_row_group(group)
    except (OSError, pa.ArrowException):
        return False
    return True


class FooterError(ValueError):
    """A footer this module does not read: the file is rewritten the usual way."""


def copy_with_entry(source: Path, target: Path, key: str, value: str) -> None:
    """Copy the Parquet file `source` to `target`, with the value of its footer's key-value
    entry `key` replaced by `value`; FooterError (and no `target`) where the footer is not
    one this module reads, or has no such entry."""
    size = source.stat().st_size
    with open(source, "rb") as f:
        if size < 12:
            raise FooterError("not a Parquet file")
        f.seek(size - 8)
        ending = f.read(8)
        (length,) = struct.unpack("<I", ending[:4])
        if ending[4:] != MAGIC or length + 12 > size:
            raise FooterError("not a plain Parquet file")
        f.seek(size - 8 - length)
        footer = f.read(length)
    replaced = with_key_value(footer, key, value)
    data_end = size - 8 - length
    shutil.copyfile(source, target)
    with open(target, "r+b") as f:
        f.truncate(data_end)
        f.seek(data_end)
        f.write(replaced + struct.pack("<I", len(replaced)) + MAGIC)


def with_key_value(footer: bytes, key: str, value: str) -> bytes:
    """`footer` (a serialized `FileMetaData`) with the value of entry `key` replaced by
    `value`; FooterError if it has no such entry."""
    reader = _Reader(footer)
    field = 0
    while True:
        kind, field = reader.field_header(field)
        if kind == 0:
            raise FooterError("no key-value entries")
        if field == _KEY_VALUES and kind == _LIST:
            header_end = reader.at
            entries = reader.key_values()
            if key.encode() not in dict(entries):
                raise FooterError(f"no entry {key}")
            replaced = [(k, value.encode() if k == key.encode() else v) for k, v in entries]
            return footer[:header_end] + _key_values(replaced) + footer[reader.at :]
        reader.skip(kind)


class _Reader:
    """Reads compact-protocol values from `data`, from `at` on."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise FooterError("footer cut short")
        value = self.data[self.at]
        self.at += 1
        return value

    def varint(self) -> int:
        shift = value = 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise FooterError("varint too long")

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def bytes_(self) -> bytes:
        length = self.varint()
        end = self.at + length
        if end > len(self.data):
            raise FooterError("footer cut short")
        value = self.data[self.at : end]
        self.at = end
        return value

    def field_header(self, previous: int) -> tuple[int, int]:
        """The type of the next field of a struct (0: the struct ends) and its id."""
        header = self.byte()
        kind, delta = header & 0x0F, header >> 4
        if kind == 0:
            return 0, previous
        return kind, previous + delta if delta else self.zigzag()

    def list_header(self) -> tuple[int, int]:
        """The type of a list's elements and their number."""
        header = self.byte()
        size = header >> 4
        return header & 0x0F, self.varint() if size == 15 else size

    def skip(self, kind: int) -> None:
        """Read past one value of type `kind` (of a field: booleans have no payload)."""
        if kind in (_TRUE, _FALSE):
            return
        self._skip_value(kind)

    def _skip_value(self, kind: int) -> None:
        if kind == _BYTE:
            self.byte()
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self._advance(8)
        elif kind == _UUID:
            self._advance(16)
        elif kind == _BINARY:
            self.bytes_()
        elif kind in (_LIST, _SET):
            element, size = self.list_header()
            for _ in range(size):
                self._skip_element(element)
        elif kind == _MAP:
            size = self.varint()
            if size:
                kinds = self.byte()
                for _ in range(size):
                    self._skip_element(kinds >> 4)
                    self._skip_element(kinds & 0x0F)
        elif kind == _STRUCT:
            field = 0
            while True:
                member, field = self.field_header(field)
                if member == 0:
                    return
                self.skip(member)
        else:
            raise FooterError(f"unknown type {kind}")

    def _skip_element(self, kind: int) -> None:
        """Read past an element of a list, set or map (a boolean is a byte there)."""
        if kind in (_TRUE, _FALSE):
            self.byte()
        else:
            self._skip_value(kind)

    def _advance(self, count: int) -> None:
        if self.at + count > len(self.data):
            raise FooterError("footer cut short")
        self.at += count

    def key_values(self) -> list[tuple[bytes, bytes | None]]:
        """A list of `KeyValue` structs: key (field 1), optional value (field 2)."""
        element, size = self.list_header()
        if element != _STRUCT:
            raise FooterError("key-value entries that are not structs")
        entries = []
        for _ in range(size):
            key: bytes | None = None
            value: bytes | None = None
            field = 0
            while True:
                kind, field = self.field_header(field)
                if kind == 0:
                    break
                if field in (1, 2) and kind == _BINARY:
                    if field == 1:
                        key = self.bytes_()
                    else:
                        value = self.bytes_()
                else:
                    self.skip(kind)
            if key is None:
                raise FooterError("a key-value entry without a key")
            entries.append((key, value))
        return entries


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key_values(entries: list[tuple[bytes, bytes | None]]) -> bytes:
    """A list of `KeyValue` structs, after its field header."""
    size = len(entries)
    out = bytearray([size << 4 | _STRUCT] if size < 15 else [0xF0 | _STRUCT])
    if size >= 15:
        out += _varint(size)
    for key, value in entries:
        out += bytes([1 << 4 | _BINARY]) + _varint(len(key)) + key
        if value is not None:
            out += bytes([1 << 4 | _BINARY]) + _varint(len(value)) + value
        out.append(0)
    return bytes(out)

"""An input file opened: its bytes (decompressed where gzipped), its lines counted, where its
units start, its Arrow batches, and its digest; locally or on object storage."""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

import pyarrow as pa

from bulkembed.storage import AnyPath, ObjectPath, open_binary, stop_on_store_failure

# What reading a damaged file raises: I/O errors, a truncated or corrupt gzip stream, a
# Parquet file that is not one.
READ_ERRORS = (OSError, EOFError, zlib.error, pa.ArrowException)


def content_digest(path: AnyPath) -> str:
    """BLAKE2b-128 of a file's bytes, read a megabyte at a time (`--verify-inputs`)."""
    digest = hashlib.blake2b(digest_size=16)
    with open_binary(path) as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def open_lines(path: AnyPath) -> Iterator[BinaryIO | gzip.GzipFile]:
    """A JSON-lines file's bytes, decompressed when it is gzipped (local or remote)."""
    with open_binary(path) as stored:
        if path.name.lower().endswith(".gz"):
            with gzip.GzipFile(fileobj=stored, mode="rb") as unzipped:
                yield unzipped
        else:
            yield stored


def count_lines(path: AnyPath) -> int:
    """Lines of a JSON-lines file (a last line without a newline counts), up to where it
    cannot be read. Counts newlines a megabyte at a time, without parsing."""
    lines = 0
    last = b"\n"
    try:
        with open_lines(path) as f:
            while block := f.read(1 << 20):
                lines += block.count(b"\n")
                last = block[-1:]
    except READ_ERRORS as e:
        stop_on_store_failure(path, e)
    return lines + (last != b"\n")


def unit_offsets(path: AnyPath, lines_per_unit: int) -> list[int]:
    """Where each unit of an uncompressed JSON-lines file starts: the byte offset of lines
    0, `lines_per_unit`, 2 × `lines_per_unit`, ... (a file that ends at a unit boundary
    gets one more offset, its size). Counts newlines a megabyte at a time."""
    offsets = [0]
    newlines = base = 0
    with open_binary(path) as f:
        while block := f.read(1 << 20):
            count = block.count(b"\n")
            at, passed = -1, 0
            while newlines + count >= len(offsets) * lines_per_unit:
                while passed < len(offsets) * lines_per_unit - newlines:
                    at = block.find(b"\n", at + 1)
                    passed += 1
                offsets.append(base + at + 1)
            newlines += count
            base += len(block)
    return offsets


def open_arrow(path: AnyPath) -> pa.RecordBatchReader:
    """An Arrow IPC file or stream (what `datasets` writes): memory-mapped, or on object
    storage read through ranged requests."""
    source = path.open_input() if isinstance(path, ObjectPath) else pa.memory_map(str(path))
    try:
        file = pa.ipc.open_file(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_stream(source)
    batches = (file.get_batch(i) for i in range(file.num_record_batches))
    return pa.RecordBatchReader.from_batches(file.schema, batches)

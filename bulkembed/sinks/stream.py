"""Records to stdout (`--output -`): JSON lines, or an Arrow IPC stream.

Rows are written in input order as soon as they are embedded; there is nothing to commit or
resume. A reader that closes the pipe (`| head`) stops the run with `PipeClosed`; a record
is written whole or not at all, as far as the reader can tell: JSON lines are written a
batch of whole lines at a time, Arrow a whole message at a time.

JSON lines carry each float in the shortest text that reads back as the same float32 (or
float16) value, as orjson writes numpy arrays: about half the bytes of float64 text, and
several times faster to write.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import IO, Any

import numpy as np
import orjson
import pyarrow as pa

from bulkembed.config import StreamFormat
from bulkembed.errors import OutputError, PipeClosed
from bulkembed.schema import SPARSE_TYPE
from bulkembed.sinks.base import Sink, unfenced, unshown
from bulkembed.wording import counted


class StreamSink(Sink):
    """Every row, in input order, on one binary stream."""

    def __init__(self, stream: IO[bytes], stream_format: StreamFormat) -> None:
        self.stream = stream
        self.format = stream_format
        self.records = 0
        self._arrow: pa.ipc.RecordBatchStreamWriter | None = None

    @property
    def description(self) -> str:
        return f"stdout ({self.format.value})"

    def start(self, schema: pa.Schema, fence: Callable[[], None] = unfenced) -> None:
        if self.format is StreamFormat.ARROW:
            self._arrow = self._guard(lambda: pa.ipc.new_stream(self.stream, schema))

    def write(self, part: str, batch: pa.RecordBatch) -> None:
        if self._arrow is not None:
            self._guard(lambda: self._arrow.write_batch(batch))
            self._guard(self.stream.flush)
            self.records += batch.num_rows
        else:
            lines = json_lines(batch)
            self._guard(lambda: self._write_lines(lines))

    def _write_lines(self, lines: bytes) -> None:
        """Write JSON lines, counting in `records` the whole lines the stream took: a reader
        that closes the pipe may have taken part of them."""
        try:
            descriptor = self.stream.fileno()
        except (OSError, ValueError):
            self.stream.write(lines)
            self.stream.flush()
            self.records += lines.count(b"\n")
            return
        self.stream.flush()
        view, written = memoryview(lines), 0
        try:
            while written < len(lines):
                written += os.write(descriptor, view[written:])
        finally:
            self.records += lines.count(b"\n", 0, written)

    def commit(self, part: str, label: dict[str, Any]) -> dict[str, Any]:
        return {}

    def finish(self, phase: Callable[[str], None] = unshown) -> None:
        if self._arrow is not None:
            self._guard(self._arrow.close)
            self._arrow = None
        self._guard(self.stream.flush)

    def close(self) -> None:
        """Nothing to drop: what was written is on the stream. `finish` ends it."""

    def _guard(self, action: Any) -> Any:
        """Run a write; a closed pipe becomes `PipeClosed`, other failures `OutputError`."""
        try:
            return action()
        except OSError as e:
            # Arrow reports a closed pipe as an IOError with the system's message.
            if isinstance(e, BrokenPipeError) or "Broken pipe" in str(e):
                self._silence()
                raise PipeClosed(
                    "stdout was closed by its reader; stopped after "
                    f"{counted(self.records, 'whole record')} written"
                ) from None
            raise OutputError(f"cannot write to stdout: {e}") from e

    def _silence(self) -> None:
        """Point the stream's descriptor at /dev/null, so that no later flush fails again."""
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)


_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def _vector_rows(column: pa.Array) -> np.ndarray:
    """A fixed_size_list column as a [rows, size] numpy array (nulls, which no vector
    column holds, are not expected)."""
    flat = column.flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(len(column), column.type.list_size)


def _list_rows(column: pa.ListArray) -> Iterator[Any]:
    """Each row of a list column as a numpy array: of numbers, or of vectors when its items
    are fixed-size lists (`multivector`)."""
    offsets = column.offsets.to_numpy()
    offsets = offsets - offsets[0]  # a slice's offsets start where it does in its parent
    values = column.flatten()
    if pa.types.is_fixed_size_list(values.type):
        items = _vector_rows(values)
    else:
        items = values.to_numpy(zero_copy_only=False)
    for start, end in zip(offsets[:-1], offsets[1:], strict=True):
        yield items[start:end]


def _column_rows(column: pa.Array) -> Iterator[Any]:
    """The values of one column, row by row, in the form the JSON writer takes fastest:
    vectors and sparse weights as numpy arrays, anything else as Python values."""
    kind = column.type
    if pa.types.is_fixed_size_list(kind):
        yield from _vector_rows(column)
    elif pa.types.is_list(kind) and (
        pa.types.is_fixed_size_list(kind.value_type) or pa.types.is_floating(kind.value_type)
    ):
        yield from _list_rows(column)
    elif kind == SPARSE_TYPE:
        indices, values = (_list_rows(field) for field in column.flatten())
        for row_indices, row_values in zip(indices, values, strict=True):
            yield {"indices": row_indices, "values": row_values}
    else:
        yield from column.to_pylist()


def json_lines(batch: pa.RecordBatch) -> bytes:
    """The rows of `batch` as JSON lines, one object per row, columns in schema order.
    Vectors are written from their numpy arrays (shortest round-trip text of each float32);
    values JSON has no type for (bytes, decimals) are written as their `str`."""
    names = batch.schema.names
    columns = [_column_rows(column) for column in batch.columns]
    return b"".join(
        orjson.dumps(dict(zip(names, row, strict=True)), default=str, option=_JSON_OPTIONS)
        for row in zip(*columns, strict=True)
    )

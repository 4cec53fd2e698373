"""Records to stdout (`--output -`): JSON lines, or an Arrow IPC stream.

Rows are written in input order as soon as they are embedded; there is nothing to commit or
resume. A reader that closes the pipe (`| head`) stops the run with `PipeClosed`; a record
is written whole or not at all, as far as the reader can tell: JSON lines are written a
batch of whole lines at a time, Arrow a whole message at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import IO, Any

import pyarrow as pa

from bulkembed.config import StreamFormat
from bulkembed.errors import OutputError, PipeClosed
from bulkembed.sinks.base import Sink
from bulkembed.wording import counted


class StreamSink(Sink):
    """Every row, in input order, on one binary stream."""

    resumable = False

    def __init__(self, stream: IO[bytes], stream_format: StreamFormat) -> None:
        self.stream = stream
        self.format = stream_format
        self.records = 0
        self._arrow: pa.ipc.RecordBatchStreamWriter | None = None

    @property
    def description(self) -> str:
        return f"stdout ({self.format.value})"

    def start(self, schema: pa.Schema) -> None:
        if self.format is StreamFormat.ARROW:
            self._arrow = self._guard(lambda: pa.ipc.new_stream(self.stream, schema))

    def write(self, part: str, batch: pa.RecordBatch) -> None:
        if self._arrow is not None:
            self._guard(lambda: self._arrow.write_batch(batch))
        else:
            lines = b"".join(
                json.dumps(row, ensure_ascii=False, default=str).encode() + b"\n"
                for row in batch.to_pylist()
            )
            self._guard(lambda: self.stream.write(lines))
        self._guard(self.stream.flush)
        self.records += batch.num_rows

    def commit(self, part: str, label: dict[str, Any]) -> dict[str, Any]:
        return {}

    def finish(self) -> None:
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
                    f"{counted(self.records, 'whole record')}"
                ) from None
            raise OutputError(f"cannot write to stdout: {e}") from e

    def _silence(self) -> None:
        """Point the stream's descriptor at /dev/null, so that no later flush fails again."""
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)

"""The sink interface: rows are written into a named part, then the part is committed."""

from __future__ import annotations

from abc import ABC, abstractmethod

import pyarrow as pa


class Sink(ABC):
    """Writes record batches into parts; a part is invisible until `commit`."""

    @abstractmethod
    def write(self, part: str, batch: pa.RecordBatch) -> None:
        """Append rows to `part`, opening it on first use."""

    @abstractmethod
    def commit(self, part: str) -> None:
        """Make `part` complete and visible at once. A part with no rows leaves no file."""

    @abstractmethod
    def close(self) -> None:
        """Drop parts that were not committed."""

"""JSON lines inputs (`.jsonl`, `.json`, `.jsonl.gz`): one unit per `records_per_unit`
lines, read one line at a time; an uncompressed file can be read from a unit's offset."""

from __future__ import annotations

from collections.abc import Container, Iterator
from typing import Any

from bulkembed.sources.base import ReadSettings, RecordFormat
from bulkembed.sources.columns import TYPE_SAMPLE_LINES
from bulkembed.sources.files import READ_ERRORS, count_lines, open_lines, unit_offsets
from bulkembed.sources.records import Chunk, InputFile
from bulkembed.sources.validate import parse_json_line
from bulkembed.storage import open_binary_at, stop_on_store_failure


def _compressed(file: InputFile) -> bool:
    return file.path.name.lower().endswith(".gz")


class JsonLinesFormat(RecordFormat):
    """JSON lines, one object per line; blank lines are no record."""

    lines = True

    def records(self, file: InputFile) -> int:
        return count_lines(file.path)

    def unit_offsets(self, file: InputFile, records_per_unit: int) -> list[int] | None:
        return None if _compressed(file) else unit_offsets(file.path, records_per_unit)

    def _objects(self, file: InputFile) -> Iterator[tuple[int, dict[str, Any]]]:
        """(line number, object) of the lines that hold a JSON object, until the file
        cannot be read."""
        try:
            with open_lines(file.path) as lines:
                for number, raw in enumerate(lines, start=1):
                    record, _ = parse_json_line(raw) if raw.strip() else (None, None)
                    if record is not None:
                        yield number, record
        except READ_ERRORS as e:
            stop_on_store_failure(file.path, e)

    def sample(self, file: InputFile) -> tuple[list[dict[str, Any]], int]:
        """The JSON objects among the first `TYPE_SAMPLE_LINES` lines (or the first one
        further on), and the line number of the first of them."""
        records: list[dict[str, Any]] = []
        first = 0
        for number, record in self._objects(file):
            if number > TYPE_SAMPLE_LINES and records:
                break
            records.append(record)
            first = first or number
        return records, first

    def values(self, file: InputFile, name: str) -> list[Any]:
        found = []
        for _, record in self._objects(file):
            if record.get(name) is not None:
                found.append(record[name])
                if len(found) == TYPE_SAMPLE_LINES:
                    break
        return found

    def read(
        self, index: int, file: InputFile, settings: ReadSettings, skip: Container[str]
    ) -> Iterator[Chunk]:
        def lines() -> Iterator[bytes]:
            with open_lines(file.path) as f:
                yield from f

        return self.units_of(index, file, settings, skip, lines(), parse_json_line, READ_ERRORS)

    def read_from(
        self,
        index: int,
        file: InputFile,
        settings: ReadSettings,
        skip: Container[str],
        unit: int,
        offset: int | None,
    ) -> Iterator[Chunk]:
        if offset is None or _compressed(file):
            return self.read(index, file, settings, skip)

        def lines() -> Iterator[bytes]:
            with open_binary_at(file.path, offset) as f:
                yield from f

        first = unit * settings.records_per_unit
        return self.units_of(
            index, file, settings, skip, lines(), parse_json_line, READ_ERRORS, first=first
        )

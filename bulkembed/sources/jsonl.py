"""JSON lines inputs (`.jsonl`, `.json`, `.jsonl.gz`): one unit per `records_per_unit`
lines; an uncompressed file can be read from a unit's offset.

Lines are parsed a chunk at a time by Arrow's JSON reader (`_arrow_block`) where each line
of the chunk is one object on its own and every record is valid; a chunk that is not
(a malformed line, a blank one, a null text, a type that differs) is parsed again one line
at a time (`RecordFormat.units_of`), which says which records are bad and why; so is a
chunk of 1 GiB or more, one that is not valid UTF-8 all through (the line path sets aside a
line with invalid UTF-8 in any field), or one with a `--keep-columns` column of
floating-point numbers.

A line longer than the reader's bound on texts (`long_texts.TextCut`) is read into a
buffer of its own, without a second copy, and read there alone (`long_lines.scan`): its
text is decoded a piece at a time, hashed whole and cut, so its record costs about its
size. One that is not plainly valid there is read by the line path, which says why."""

from __future__ import annotations

import io
from collections.abc import Container, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from bulkembed.contracts import part_name
from bulkembed.sources.base import ReadSettings, RecordFormat, all_valid
from bulkembed.sources.columns import TYPE_SAMPLE_LINES
from bulkembed.sources.long_lines import scan
from bulkembed.sources.long_texts import valid_utf8
from bulkembed.sources.opening import READ_ERRORS, count_lines, open_lines, unit_offsets
from bulkembed.sources.records import BadRecord, Chunk, InputFile
from bulkembed.sources.validate import parse_json_line
from bulkembed.storage import open_binary_at, stop_on_store_failure


def _compressed(file: InputFile) -> bool:
    return file.path.name.lower().endswith(".gz")


class JsonLinesFormat(RecordFormat):
    """JSON lines, one object per line; blank lines are no record."""

    name = "jsonl"
    suffixes = (".jsonl", ".jsonl.gz", ".json")
    title = "JSON lines"
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
        def lines() -> Iterator[bytes | bytearray]:
            with open_lines(file.path) as f:
                yield from _bounded_lines(f, settings)

        return self._blocks(index, file, settings, skip, lines())

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

        def lines() -> Iterator[bytes | bytearray]:
            with open_binary_at(file.path, offset) as f:
                yield from _bounded_lines(f, settings)

        return self._blocks(index, file, settings, skip, lines(), unit * settings.records_per_unit)

    def _scanned(
        self, index: int, file: InputFile, settings: ReadSettings, line: bytearray, start: int
    ) -> Chunk | None:
        """The chunk of one long line read in place (`long_lines.scan`), its text cut and
        its content hash taken; its buffer is emptied then. None where it was not."""
        cut = settings.text_cut
        assert cut is not None
        scanned = scan(line, settings.text_column, cut.chars, cut.content_hash())
        if scanned is None:
            return None
        line.clear()
        record = scanned.record
        (chunk,) = self.units_of(
            index, file, settings, (), [b"{}"], lambda _: (record, None), (), start
        )
        if len(chunk):
            chunk.hashes = np.array([scanned.digest], "S16")
        return chunk

    def _blocks(
        self,
        index: int,
        file: InputFile,
        settings: ReadSettings,
        skip: Container[str],
        lines: Iterable[bytes | bytearray],
        first: int = 0,
    ) -> Iterator[Chunk]:
        """Chunks of `lines` (the first is number `first`), unit by unit: each chunk's
        lines gathered, then parsed at once (`_parsed`); a long line (a `bytearray`, see
        `_bounded_lines`) is a chunk alone. Lines of skipped units are not parsed. A read
        error sets the rest of the file aside."""
        per_unit = settings.records_per_unit
        block: list[bytes | bytearray] = []
        size = 0
        start = number = first
        try:
            for raw in lines:
                alone = bool(block) and (
                    isinstance(raw, bytearray) or isinstance(block[0], bytearray)
                )
                if number // per_unit != start // per_unit:
                    yield from self._parsed(index, file, settings, skip, block, start, True)
                    block, size, start = [], 0, number
                elif alone or settings.chunk_full(len(block), size):
                    yield from self._parsed(index, file, settings, skip, block, start, False)
                    block, size, start = [], 0, number
                block.append(raw)
                size += len(raw)
                number += 1
        except READ_ERRORS as e:
            stop_on_store_failure(file.path, e)
            reason = f"unreadable after line {number}: {e or type(e).__name__}"
            unreadable = BadRecord(str(file.path), reason, line=number + 1)
            for chunk in self._parsed(index, file, settings, skip, block, start, True):
                if chunk.last_in_unit:
                    chunk.bad.append(unreadable)
                yield chunk
            return
        yield from self._parsed(index, file, settings, skip, block, start, True)

    def _parsed(
        self,
        index: int,
        file: InputFile,
        settings: ReadSettings,
        skip: Container[str],
        block: list[bytes | bytearray],
        start: int,
        last: bool,
    ) -> Iterator[Chunk]:
        """The chunks of `block`, lines of one unit from line number `start` on (`last`:
        the unit ends with them): one, parsed by Arrow where it can, else line by line."""
        unit = start // settings.records_per_unit
        if part_name(index, unit) in skip:
            return
        if len(block) == 1 and isinstance(block[0], bytearray):
            chunk = self._scanned(index, file, settings, block[0], start)
        else:
            chunk = _arrow_block(index, unit, file, block, start, settings)
        if chunk is not None:
            chunk.last_in_unit = last
            yield chunk
            return
        chunks = self.units_of(index, file, settings, (), block, parse_json_line, (), start)
        for chunk in chunks:
            chunk.last_in_unit = last and chunk.last_in_unit
            yield chunk


_OPEN, _CLOSE, _RETURN, _NEWLINE, _ARRAY = (ord(c) for c in "{}\r\n[")
# A line with more opening brackets may nest deeper than Python's JSON parser reads (the
# recursion limit, 1000): it is read line by line, and set aside if so.
_MOST_BRACKETS = 500
# Arrow's JSON reader takes blocks of less than 2 GiB; larger chunks are read line by line.
_LARGEST_BLOCK = 1 << 30
# A long line is read this much at a time.
_LONG_LINE_PIECE = 16 << 20


def _has_floats(kind: pa.DataType) -> bool:
    """Whether values of `kind` hold floating-point numbers. Arrow's JSON reader makes any
    JSON integer a float there, 2^53 + 1 rounded; line by line such a record is set aside
    (`misfit`), so chunks with such a column are read line by line."""
    if pa.types.is_floating(kind):
        return True
    return any(_has_floats(kind.field(i).type) for i in range(kind.num_fields))


def _one_object_a_line(data: bytes, lines: int) -> bool:
    """Whether each of the `lines` lines of `data` (each ending in a newline) starts with
    `{` and ends with `}` (before an optional carriage return), with at most
    `_MOST_BRACKETS` opening brackets: then no object spans two lines, a line with two
    objects shows as one row too many, and no line nests deeper than a line read alone may."""
    buffer = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buffer == _NEWLINE)
    if len(ends) != lines or not lines:
        return False
    starts = np.concatenate([[0], ends[:-1] + 1])
    if np.any(ends - starts < 2) or np.any(buffer[starts] != _OPEN):
        return False
    before = buffer[ends - 1]
    closing = np.where(before == _RETURN, buffer[np.maximum(ends - 2, starts)], before)
    if not np.all(closing == _CLOSE):
        return False
    brackets = np.flatnonzero((buffer == _OPEN) | (buffer == _ARRAY))
    before_each_end = np.searchsorted(brackets, ends)
    return bool(np.diff(before_each_end, prepend=0).max() <= _MOST_BRACKETS)


def _bounded_lines(f: Any, settings: ReadSettings) -> Iterator[bytes | bytearray]:
    """The lines of the binary file `f`; one longer than the reader's bound on texts as a
    `bytearray` (grown in place, with no copy of the whole line), the others as bytes."""
    if settings.text_cut is None:
        yield from f
        return
    longest = settings.text_cut.chars
    while line := f.readline(longest + 1):
        if len(line) <= longest or line.endswith(b"\n"):
            yield line
            continue
        long = bytearray(line)
        del line
        while piece := f.readline(_LONG_LINE_PIECE):
            long += piece
            if piece.endswith(b"\n"):
                break
        yield long


def _parse_options(settings: ReadSettings) -> pa_json.ParseOptions:
    """Arrow's JSON parser's options for the run's columns: other fields are ignored."""
    fields = {settings.text_column: pa.string(), **settings.column_types}
    if settings.id_column is not None:
        fields = {settings.id_column: settings.id_type, **fields}
    return pa_json.ParseOptions(
        explicit_schema=pa.schema(list(fields.items())), unexpected_field_behavior="ignore"
    )


def _arrow_block(
    index: int,
    unit: int,
    file: InputFile,
    block: list[bytes | bytearray],
    start: int,
    settings: ReadSettings,
) -> Chunk | None:
    """The records of `block` as one chunk of Arrow arrays, parsed by Arrow's JSON reader,
    when each line is one JSON object and every record is valid (`all_valid`); None when
    one may not be."""
    if any(_has_floats(kind) for kind in settings.column_types.values()):
        return None
    data = b"".join(block)
    if data and not data.endswith(b"\n"):
        data += b"\n"  # the file's last line
    if len(data) > _LARGEST_BLOCK or not _one_object_a_line(data, len(block)):
        return None
    # Arrow's JSON reader checks only the fields it reads; the line path (`parse_json_line`)
    # sets aside a line with invalid UTF-8 anywhere.
    if not valid_utf8(data):
        return None
    # One block for the whole chunk, read on this thread.
    reading = pa_json.ReadOptions(use_threads=False, block_size=len(data) + 1)
    try:
        options = _parse_options(settings)
        table = pa_json.read_json(io.BytesIO(data), read_options=reading, parse_options=options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(block):
        return None
    batch = table.combine_chunks().to_batches()
    if len(batch) != 1:
        return None
    return all_valid(index, unit, file, batch[0], start, settings)

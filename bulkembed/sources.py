"""List input shards in a deterministic order and stream their records in small chunks.

A shard is one file. A unit of work is a Parquet row group or a fixed range of JSONL lines;
it is the granularity of output parts. Records travel as `Chunk`s of at most `chunk_size`
rows; the last chunk of each unit says so, so that a unit with no valid row still ends.
Nothing here holds more than one chunk of a file in memory.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from bulkembed.errors import InputError

FORMATS = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl", ".jsonl.gz": "jsonl"}
DEFAULT_ID_COLUMN = "id"
DEFAULT_CHUNK_SIZE = 512
DEFAULT_LINES_PER_UNIT = 4096


@dataclass(frozen=True, slots=True)
class Shard:
    """One input file. `name` is its path relative to the input it was found through."""

    path: Path
    name: str
    format: str


@dataclass(slots=True)
class BadRecord:
    """A record that cannot be embedded, with where it was and why.

    `row` is a Parquet row index (from 0); `line` a JSONL line number (from 1)."""

    source: str
    reason: str
    id: Any = None
    row: int | None = None
    line: int | None = None


@dataclass(slots=True)
class Chunk:
    """Up to `chunk_size` consecutive records of one unit of work."""

    shard: int
    unit: int
    ids: pa.Array
    texts: list[str]
    last_in_unit: bool
    bad: list[BadRecord] = field(default_factory=list)


def _format_of(path: Path) -> str | None:
    name = path.name.lower()
    for suffix, fmt in FORMATS.items():
        if name.endswith(suffix):
            return fmt
    return None


def _glob_root(pattern: str) -> Path:
    """The longest leading part of a glob pattern without wildcards."""
    parts = Path(pattern).parts
    root = []
    for part in parts:
        if glob.has_magic(part):
            break
        root.append(part)
    return Path(*root) if root else Path(".")


def _expand(argument: str) -> list[tuple[Path, Path]]:
    """(file, root) pairs for one input argument; ids are relative to the root."""
    path = Path(argument).expanduser()
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file() and _format_of(p)]
        return [(p, path) for p in files]
    if path.is_file():
        if _format_of(path) is None:
            raise InputError(
                f"unsupported input {argument}: "
                "use .parquet, .jsonl, .jsonl.gz or .json (JSON lines)"
            )
        return [(path, path.parent)]
    if glob.has_magic(argument):
        root = _glob_root(argument)
        found = [Path(p) for p in glob.glob(argument, recursive=True)]
        files = [p for p in found if p.is_file() and _format_of(p)]
        for directory in (p for p in found if p.is_dir()):
            files.extend(p for p in directory.rglob("*") if p.is_file() and _format_of(p))
        if not files:
            raise InputError(f"input pattern {argument} matches no .parquet or .jsonl file")
        return [(p, root) for p in files]
    raise InputError(f"input not found: {argument}")


def list_shards(inputs: tuple[str, ...] | list[str]) -> list[Shard]:
    """Every input file once, sorted by path: the order in which units are numbered."""
    by_path: dict[Path, Shard] = {}
    for argument in inputs:
        for path, root in _expand(argument):
            resolved = path.resolve()
            if resolved not in by_path:
                name = os.path.relpath(path, root)
                by_path[resolved] = Shard(resolved, name, _format_of(path) or "")
    if not by_path:
        raise InputError(f"no .parquet or .jsonl file found in {', '.join(inputs)}")
    return sorted(by_path.values(), key=lambda s: str(s.path))


def count_records(shards: list[Shard]) -> int:
    """Rows in all shards: Parquet from its footer, JSONL by counting non-blank lines."""
    import pyarrow.parquet as pq

    total = 0
    for shard in shards:
        if shard.format == "parquet":
            try:
                total += pq.ParquetFile(shard.path).metadata.num_rows
            except (OSError, pa.ArrowException):
                continue
        else:
            with _open_lines(shard.path) as f:
                total += sum(1 for line in f if line.strip())
    return total


def _open_lines(path: Path) -> IO[bytes]:
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


@dataclass(slots=True)
class _Rows:
    """Records collected for the chunk being built."""

    ids: list[Any] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    bad: list[BadRecord] = field(default_factory=list)


def _ids_array(ids: list[Any]) -> pa.Array:
    """Integer ids stay integers; anything else, or a mix, becomes strings."""
    if ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return pa.array(ids, type=pa.int64())
    return pa.array([str(i) for i in ids], type=pa.string())


class RecordReader:
    """Stream `Chunk`s from shards, unit after unit, stopping after `limit` documents."""

    def __init__(
        self,
        shards: list[Shard],
        text_column: str = "text",
        id_column: str | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        lines_per_unit: int = DEFAULT_LINES_PER_UNIT,
        limit: int | None = None,
    ) -> None:
        self.shards = shards
        self.text_column = text_column
        self.id_column = id_column
        self.chunk_size = chunk_size
        self.lines_per_unit = lines_per_unit
        self.remaining = limit

    def __iter__(self) -> Iterator[Chunk]:
        for index, shard in enumerate(self.shards):
            if self.remaining == 0:
                return
            reader = self._parquet if shard.format == "parquet" else self._jsonl
            yield from self._limited(reader(index, shard))

    def _limited(self, chunks: Iterator[Chunk]) -> Iterator[Chunk]:
        for chunk in chunks:
            if self.remaining is None:
                yield chunk
                continue
            if len(chunk.texts) >= self.remaining:
                chunk.texts = chunk.texts[: self.remaining]
                chunk.ids = chunk.ids[: self.remaining]
                chunk.last_in_unit = True
                self.remaining = 0
                yield chunk
                return
            self.remaining -= len(chunk.texts)
            yield chunk

    def _id_column_for(self, columns: list[str], source: str) -> str | None:
        if self.id_column is None:
            return DEFAULT_ID_COLUMN if DEFAULT_ID_COLUMN in columns else None
        if self.id_column not in columns:
            raise InputError(
                f"id column '{self.id_column}' not found in {source}; "
                f"columns: {', '.join(columns) or 'none'}"
            )
        return self.id_column

    def _missing_text(self, columns: list[str], source: str) -> InputError:
        return InputError(
            f"text column '{self.text_column}' not found in {source}; "
            f"columns: {', '.join(columns) or 'none'} (choose one with --text-column)"
        )

    def _parquet(self, index: int, shard: Shard) -> Iterator[Chunk]:
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(shard.path)
        except (OSError, pa.ArrowException) as e:
            raise InputError(f"cannot read {shard.path}: {e}") from e
        columns = parquet.schema_arrow.names
        if self.text_column not in columns:
            raise self._missing_text(columns, str(shard.path))
        text_type = parquet.schema_arrow.field(self.text_column).type
        if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
            raise InputError(
                f"text column '{self.text_column}' in {shard.path} holds {text_type}, not strings"
            )
        id_column = self._id_column_for(columns, str(shard.path))
        wanted = [self.text_column] + ([id_column] if id_column else [])
        row = 0
        for group in range(parquet.num_row_groups):
            batches = parquet.iter_batches(
                batch_size=self.chunk_size, row_groups=[group], columns=wanted
            )
            pending: Chunk | None = None
            for batch in batches:
                if pending is not None:
                    yield pending
                pending = self._parquet_chunk(index, group, shard, batch, row, id_column)
                row += batch.num_rows
            if pending is None:
                pending = Chunk(index, group, pa.array([], pa.string()), [], True)
            pending.last_in_unit = True
            yield pending

    def _parquet_chunk(
        self,
        index: int,
        group: int,
        shard: Shard,
        batch: pa.RecordBatch,
        first_row: int,
        id_column: str | None,
    ) -> Chunk:
        texts = batch.column(self.text_column).to_pylist()
        if id_column is None:
            ids: list[Any] = [f"{shard.name}:{first_row + i}" for i in range(len(texts))]
        else:
            ids = batch.column(id_column).to_pylist()
        rows = _Rows()
        for offset, (doc_id, text) in enumerate(zip(ids, texts, strict=True)):
            if text is None:
                rows.bad.append(
                    BadRecord(str(shard.path), "text is null", doc_id, first_row + offset)
                )
            elif doc_id is None:
                rows.bad.append(BadRecord(str(shard.path), "id is null", row=first_row + offset))
            else:
                rows.ids.append(doc_id)
                rows.texts.append(text)
        return Chunk(index, group, _ids_array(rows.ids), rows.texts, False, rows.bad)

    def _jsonl(self, index: int, shard: Shard) -> Iterator[Chunk]:
        id_column: str | None = None
        checked = False
        rows = _Rows()
        unit = 0
        line_number = -1
        with _open_lines(shard.path) as lines:
            for line_number, raw in enumerate(lines):
                if line_number // self.lines_per_unit != unit:
                    yield Chunk(index, unit, _ids_array(rows.ids), rows.texts, True, rows.bad)
                    rows = _Rows()
                    unit = line_number // self.lines_per_unit
                elif len(rows.texts) + len(rows.bad) >= self.chunk_size:
                    yield Chunk(index, unit, _ids_array(rows.ids), rows.texts, False, rows.bad)
                    rows = _Rows()
                if not raw.strip():
                    continue
                record, reason = _parse_json_line(raw)
                if record is not None and not checked:
                    if self.text_column not in record:
                        raise self._missing_text(
                            list(record), f"{shard.path} line {line_number + 1}"
                        )
                    id_column = self._id_column_for(list(record), f"{shard.path}")
                    checked = True
                if record is not None:
                    reason = self._take_record(record, shard, line_number, id_column, rows)
                if reason is not None:
                    doc_id = record.get(id_column) if record and id_column else None
                    rows.bad.append(
                        BadRecord(str(shard.path), reason, doc_id, line=line_number + 1)
                    )
        yield Chunk(index, unit, _ids_array(rows.ids), rows.texts, True, rows.bad)

    def _take_record(
        self,
        record: dict[str, Any],
        shard: Shard,
        line_number: int,
        id_column: str | None,
        rows: _Rows,
    ) -> str | None:
        """Add a parsed record to `rows`, or return why it cannot be embedded."""
        if self.text_column not in record:
            return f"no '{self.text_column}' field"
        text = record[self.text_column]
        if text is None:
            return "text is null"
        if not isinstance(text, str):
            return f"text is of type {type(text).__name__}, not a string"
        if id_column is None:
            doc_id: Any = f"{shard.name}:{line_number}"
        else:
            doc_id = record.get(id_column)
            if doc_id is None:
                return f"no '{id_column}' field" if id_column not in record else "id is null"
            if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
                return f"id is of type {type(doc_id).__name__}, not a string or an integer"
        rows.ids.append(doc_id)
        rows.texts.append(text)
        return None


def _parse_json_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object on one line, or None and the reason it is not one."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"invalid UTF-8 at byte {e.start}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"malformed JSON: {e.msg} at column {e.colno}"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    return record, None

"""One record validator for every input format: why a record cannot be embedded."""

from __future__ import annotations

import json
from typing import Any

from bulkembed.sources.columns import encodable
from bulkembed.sources.records import BadRecord

BYTE_ORDER_MARK = "\ufeff"


def decoded(value: Any, what: str) -> tuple[Any, str | None]:
    """A value of a bytes column as a string, or the reason it is not valid UTF-8."""
    if not isinstance(value, bytes):
        return value, None
    try:
        return value.decode("utf-8"), None
    except UnicodeDecodeError as e:
        return None, f"{what} is not valid UTF-8 (byte {e.start} of a binary column)"


def problem(doc_id: Any, text: Any) -> str | None:
    """Why a record with `doc_id` and `text` cannot be embedded, or None: its text must be
    a string, its id a string or an integer, both valid Unicode (JSON may hold unpaired
    surrogates)."""
    if text is None:
        return "text is null"
    if not isinstance(text, str):
        return f"text is of type {type(text).__name__}, not a string"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"text holds an unpaired surrogate at character {e.start}, not valid Unicode"
    if doc_id is None:
        return "id is null"
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        return f"id is of type {type(doc_id).__name__}, not a string or an integer"
    if isinstance(doc_id, str) and not encodable(doc_id):
        return "id holds an unpaired surrogate, not valid Unicode"
    return None


def bad_record(source: str, reason: str, doc_id: Any, position: int, lines: bool) -> BadRecord:
    """A bad record at a line (numbered from 1 in messages, from 0 in `position`) or a row."""
    if lines:
        return BadRecord(source, reason, doc_id, line=position + 1)
    return BadRecord(source, reason, doc_id, row=position)


def parse_json_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object on one line, or None and the reason it is not one. A UTF-8
    byte-order mark before it (Windows tools write one at the start of a file) is no part
    of it."""
    try:
        line = raw.decode("utf-8").removeprefix(BYTE_ORDER_MARK)
    except UnicodeDecodeError as e:
        return None, f"invalid UTF-8 at byte {e.start}"
    try:
        # The standard library, not orjson: it reads an escaped unpaired surrogate (which
        # `problem` then names), and says at which column a line is malformed. Most lines
        # never come here: Arrow's JSON reader takes their blocks whole (`jsonl`).
        record = json.loads(line)
    except json.JSONDecodeError as e:
        # Some messages end in "at" already ("Invalid control character at").
        return None, f"malformed JSON: {e.msg.removesuffix(' at')} at column {e.colno}"
    except RecursionError:
        return None, "JSON nested too deeply to read"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    return record, None

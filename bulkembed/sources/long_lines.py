"""One JSON line far longer than a model reads, read without a copy of its text.

A JSON object on one line of gigabytes (a crawled page in a text field) would cost its
size several times over in any parser that makes its text a value: Python's makes a `str`
(up to 4 bytes a character), Arrow's a string twice the size while it grows. `scan` reads
the line in place instead: it finds the object's fields, parses the small ones as usual,
and of the text field's JSON string decodes a piece at a time, each piece hashed (the
content hash, over the whole text) and only the first `keep` characters kept.

Whatever `scan` does not read as plainly valid (a structure it does not expect, a text
that is not a string, an escaped unpaired surrogate) it leaves to the other parsers, which
then say what is wrong as they say it of short lines.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from bulkembed.sources.long_texts import ContentHash

# Decoded a piece of about this many bytes at a time.
_PIECE = 1 << 20
# A piece never ends within this many bytes after a backslash: an escape (`\uXXXX`, a
# surrogate pair of two) is never cut.
_ESCAPE = 12
_SPACE = re.compile(rb"[ \t\r\n]*")
_SPECIAL = re.compile(rb'["{}\[\],]')
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


@dataclass(frozen=True, slots=True)
class LongRecord:
    """A long line's object, its text cut to its start, and its text's content hash."""

    record: dict[str, Any]
    digest: bytes


def scan(line: bytearray, text_column: str, keep: int, content: ContentHash) -> LongRecord | None:
    """The object on `line` with the first `keep` characters of its field `text_column`,
    and that whole text's content hash (`content`); None where the line is not plainly one
    valid object with a string there (see the module's docstring)."""
    try:
        fields = _fields(line)
    except ValueError:
        return None
    record: dict[str, Any] = {}
    text: tuple[int, int] | None = None
    for key, (start, end) in fields.items():
        if key == text_column and line[start] == _QUOTE:
            text = (start + 1, end - 1)
            record[key] = None
        else:
            try:
                record[key] = json.loads(line[start:end])
            except (ValueError, RecursionError):
                return None
    if text is None:
        return None
    found = _decoded(line, *text, keep, content)
    if found is None:
        return None
    record[text_column] = found
    return LongRecord(record, content.digest())


def _fields(line: bytearray) -> dict[str, tuple[int, int]]:
    """Where the value of each field of the object on `line` lies (the last of a key, as
    `json.loads` takes it)."""
    at = _skip(line, 0)
    if line[at : at + 1] != b"{":
        raise ValueError("not an object")
    fields: dict[str, tuple[int, int]] = {}
    at = _skip(line, at + 1)
    if line[at : at + 1] == b"}":
        return _end(line, at + 1, fields)
    while True:
        if line[at] != _QUOTE:
            raise ValueError("a key is not a string")
        after = _string_end(line, at + 1) + 1
        key = json.loads(line[at:after])
        at = _skip(line, after)
        if line[at : at + 1] != b":":
            raise ValueError("no colon")
        start = _skip(line, at + 1)
        end = _value_end(line, start)
        fields[key] = (start, end)
        at = _skip(line, end)
        if line[at : at + 1] == b"}":
            return _end(line, at + 1, fields)
        if line[at : at + 1] != b",":
            raise ValueError("no comma")
        at = _skip(line, at + 1)


def _end(
    line: bytearray, at: int, fields: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    if _skip(line, at) != len(line):
        raise ValueError("more after the object")
    return fields


def _skip(line: bytearray, at: int) -> int:
    match = _SPACE.match(line, at)
    assert match is not None
    return match.end()


def _string_end(line: bytearray, at: int) -> int:
    """Where the JSON string whose characters start at `at` ends: its closing quote."""
    while True:
        quote = line.find(b'"', at)
        if quote < 0:
            raise ValueError("a string does not end")
        slashes = quote
        while slashes > at and line[slashes - 1] == _BACKSLASH:
            slashes -= 1
        if (quote - slashes) % 2 == 0:
            return quote
        at = quote + 1


def _value_end(line: bytearray, at: int) -> int:
    """Where the JSON value that starts at `at` ends (past its last byte)."""
    if line[at : at + 1] == b'"':
        return _string_end(line, at + 1) + 1
    depth = 0
    while True:
        special = _SPECIAL.search(line, at)
        if special is None:
            raise ValueError("a value does not end")
        at = special.start()
        byte = line[at]
        if byte == _QUOTE:
            at = _string_end(line, at + 1) + 1
            continue
        if byte in b"{[":
            depth += 1
        elif depth == 0:
            return _trimmed(line, special.start())
        elif byte in b"}]":
            depth -= 1
            if depth == 0:
                return at + 1
        at += 1


def _trimmed(line: bytearray, end: int) -> int:
    """`end` back past the spaces before it (a number or literal ends there)."""
    while end and line[end - 1] in b" \t\r\n":
        end -= 1
    return end


def _decoded(line: bytearray, start: int, end: int, keep: int, content: ContentHash) -> str | None:
    """The first `keep` characters of the JSON string between `start` and `end`, all of it
    decoded a piece at a time into `content`; None for an unpaired surrogate."""
    kept: list[str] = []
    count = 0
    while start < end:
        stop = _piece_end(line, start, end)
        try:
            piece = json.loads(b'"' + line[start:stop] + b'"')
            content.update(piece)
        except (ValueError, UnicodeEncodeError):
            return None
        if count < keep:
            kept.append(piece[: keep - count])
            count += len(kept[-1])
        start = stop
    return "".join(kept)


def _piece_end(line: bytearray, start: int, end: int) -> int:
    """Where a piece of about `_PIECE` bytes from `start` may end: on a character's first
    byte, with no backslash in the `_ESCAPE` bytes before it."""
    stop = start + _PIECE
    while stop < end:
        if line[stop] & 0xC0 != 0x80 and line.rfind(b"\\", stop - _ESCAPE, stop) < 0:
            return stop
        stop += 1
    return end

"""Invalid UTF-8 anywhere in a JSON line sets its record aside, the same whether its chunk
is parsed whole by Arrow or line by line (as a chunk holding a malformed line is)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from bulkembed.sources import RecordReader, list_inputs

INVALID = [b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"]


def _outcome(path):
    chunks = list(RecordReader(list_inputs([str(path)])).read())
    kept = [
        pair for c in chunks for pair in zip(c.ids.to_pylist(), c.texts.to_pylist(), strict=True)
    ]
    bad = [(b.line, b.reason) for c in chunks for b in c.bad]
    return kept, bad


@settings(max_examples=60, deadline=None)
@given(
    records=st.integers(2, 6),
    damaged=st.integers(0, 5),
    invalid=st.sampled_from(INVALID),
    place=st.floats(0, 1),
)
def test_both_paths_set_aside_the_same_records(tmp_path_factory, records, damaged, invalid, place):
    folder = tmp_path_factory.mktemp("utf8")
    lines = [
        json.dumps({"id": f"d{i}", "text": f"text {i}", "meta": f"note {i}"}).encode()
        for i in range(records)
    ]
    damaged %= records
    # Inside a string of the line (a key or a value, read or not), never in its brackets.
    line = lines[damaged]
    quotes = [i for i, byte in enumerate(line) if byte == ord('"')]
    at = quotes[int(place * (len(quotes) - 1))] + 1
    lines[damaged] = line[:at] + invalid + line[at:]
    whole = folder / "whole.jsonl"
    whole.write_bytes(b"\n".join(lines) + b"\n")
    # The same lines and a malformed one: the chunk is then read line by line.
    by_line = folder / "by-line.jsonl"
    by_line.write_bytes(b"\n".join(lines) + b"\n{\n")
    kept, bad = _outcome(whole)
    kept_by_line, bad_by_line = _outcome(by_line)
    assert kept == kept_by_line
    assert bad == bad_by_line[:-1] and bad_by_line[-1][0] == records + 1
    assert [line for line, _ in bad] == [damaged + 1]

"""JSON lines parsed a chunk at a time by Arrow's JSON reader give what parsing them one
line at a time gives: the same records, positions, passthrough values and bad records,
whatever lines a chunk mixes."""

import gzip

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bulkembed.sources import RecordReader, jsonl, list_inputs
from bulkembed.sources.base import RecordFormat

# Deeper than Python's JSON parser reads.
DEEP = b"[" * 100_000 + b"]" * 100_000
# Each kind of line, from the line's number; some are two lines.
LINES = {
    "valid": lambda i: b'{"id": "d%d", "text": "text %d", "n": %d}' % (i, i, i),
    "valid, crlf": lambda i: b'{"id": "d%d", "text": "crlf %d"}\r' % (i, i),
    "valid, spaces": lambda i: b'  {"id": "d%d", "text": "sp"}  ' % i,
    "valid, escapes": lambda i: b'{"id": "d%d", "text": "caf\\u00e9 \\"q\\" \\n"}' % i,
    "null text": lambda i: b'{"id": "d%d", "text": null}' % i,
    "no text": lambda i: b'{"id": "d%d"}' % i,
    "integer id": lambda i: b'{"id": %d, "text": "int id"}' % i,
    "float id": lambda i: b'{"id": 1.5, "text": "float id"}',
    "text a number": lambda i: b'{"id": "d%d", "text": 5}' % i,
    "malformed": lambda i: b'{"id": "d%d", "text": }' % i,
    "blank": lambda i: b"   ",
    "two objects": lambda i: b'{"id": "d%d", "text": "x"} {"id": "e%d", "text": "y"}' % (i, i),
    "spans two lines": lambda i: b'{"id": "d%d",\n"text": "x"}' % i,
    "byte-order mark": lambda i: b'\xef\xbb\xbf{"id": "d%d", "text": "bom"}' % i,
    "key twice": lambda i: b'{"id": "d%d", "text": "a", "text": "b"}' % i,
    "invalid UTF-8": lambda i: b'{"id": "d%d", "text": "\xff"}' % i,
    "unpaired surrogate": lambda i: b'{"id": "d%d", "text": "\\ud800"}' % i,
    "deep": lambda i: b'{"id": "d%d", "text": "x", "m": %s}' % (i, DEEP),
    "an array": lambda i: b"[1, 2]",
    "empty object": lambda i: b"{}",
}


def _write(path, kinds, last_newline):
    lines = [LINES[kind](i) for i, kind in enumerate(kinds)]
    data = b"\n".join(lines) + (b"\n" if last_newline else b"")
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)


def _read(path, id_column, keep):
    reader = RecordReader(
        list_inputs([str(path)]),
        id_column=id_column,
        chunk_size=3,
        records_per_unit=5,
        keep_columns=keep,
    )
    found = []
    for chunk in reader.read():
        columns = {name: values.to_pylist() for name, values in chunk.columns.items()}
        bad = [(b.line, b.reason, b.id) for b in chunk.bad]
        records = (chunk.ids.to_pylist(), chunk.texts.to_pylist(), chunk.positions.tolist())
        found.append((chunk.unit, chunk.last_in_unit, records, columns, bad))
    return found


def _flattened(found):
    """What the chunks hold, whatever their cut: records, values and bad records by unit,
    and which units ended."""
    units = {}
    for unit, last, (ids, texts, positions), columns, bad in found:
        held = units.setdefault(unit, {"records": [], "columns": {}, "bad": [], "ends": 0})
        held["records"] += list(zip(ids, texts, positions, strict=True))
        for name, values in columns.items():
            held["columns"].setdefault(name, []).extend(values)
        held["bad"] += bad
        held["ends"] += last
    return units


@given(
    kinds=st.lists(st.sampled_from(sorted(LINES)), max_size=16),
    last_newline=st.booleans(),
    named_ids=st.booleans(),
    gzipped=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_chunks_parsed_by_arrow_hold_what_lines_parsed_alone_hold(
    tmp_path_factory, kinds, last_newline, named_ids, gzipped
):
    path = tmp_path_factory.mktemp("jsonl") / ("a.jsonl.gz" if gzipped else "a.jsonl")
    _write(path, ["valid", *kinds], last_newline)
    id_column, keep = ("id", ("n",)) if named_ids else (None, ())
    found = _read(path, id_column, keep)
    patched = pytest.MonkeyPatch()
    with patched.context() as m:
        m.setattr(jsonl, "_arrow_block", lambda *arguments: None)
        alone = _read(path, id_column, keep)
    assert _flattened(found) == _flattened(alone)
    assert all(held["ends"] == 1 for held in _flattened(found).values())


def test_clean_lines_are_parsed_by_arrow_alone(tmp_path, monkeypatch):
    path = tmp_path / "a.jsonl"
    _write(path, ["valid", "valid, crlf", "valid, escapes", "valid"] * 5, True)

    def line_by_line(*arguments, **options):
        raise AssertionError("a clean chunk was parsed line by line")

    monkeypatch.setattr(RecordFormat, "units_of", line_by_line)
    found = _read(path, "id", ("n",))
    ids = [i for _, _, (chunk_ids, _, _), _, _ in found for i in chunk_ids]
    assert ids == [f"d{i}" for i in range(20)]
    texts = [t for _, _, (_, chunk_texts, _), _, _ in found for t in chunk_texts]
    assert texts[2] == 'café "q" \n' and texts[1] == "crlf 1"
    assert [unit for unit, last, *_ in found if last] == [0, 1, 2, 3]


def test_an_integer_a_float_column_cannot_hold_exactly_is_set_aside_whatever_its_chunk(tmp_path):
    # The column's type comes from its first 100 values: floats.
    lines = [b'{"id": "d%d", "text": "t", "score": 0.5}' % i for i in range(101)]
    lines.append(b'{"id": "big", "text": "t", "score": 9007199254740993}')
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    reader = RecordReader(list_inputs([str(path)]), id_column="id", keep_columns=("score",))
    chunks = list(reader.read())
    assert [i for c in chunks for i in c.ids.to_pylist()] == [f"d{i}" for i in range(101)]
    assert [(b.id, b.line) for c in chunks for b in c.bad] == [("big", 102)]

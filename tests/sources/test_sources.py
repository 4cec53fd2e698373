import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from helpers import write_jsonl, write_parquet

from bulkembed.errors import InputError, UsageError
from bulkembed.sources import RecordReader, count_records, list_inputs, unit_names


def _records(n: int, start: int = 0) -> list[dict]:
    return [{"id": f"d{i}", "text": f"text number {i}"} for i in range(start, start + n)]


def _read(files, done=(), **options):
    chunks = list(RecordReader(files, **options).read(done))
    ids = [i for c in chunks for i in c.ids.to_pylist()]
    texts = [t for c in chunks for t in c.texts.to_pylist()]
    bad = [b for c in chunks for b in c.bad]
    return chunks, ids, texts, bad


def test_input_files_are_found_recursively_sorted_and_once(tmp_path):
    write_jsonl(tmp_path / "b" / "two.jsonl", _records(1))
    write_jsonl(tmp_path / "a.jsonl", _records(1))
    write_parquet(tmp_path / "b" / "c" / "three.parquet", _records(1))
    (tmp_path / "notes.txt").write_text("not an input")
    files = list_inputs([str(tmp_path), str(tmp_path / "a.jsonl"), str(tmp_path / "*.jsonl")])
    assert [s.name for s in files] == ["a.jsonl", "b/c/three.parquet", "b/two.jsonl"]
    assert [s.format for s in files] == ["jsonl", "parquet", "jsonl"]


def test_globs_name_files_relative_to_their_fixed_part(tmp_path):
    write_jsonl(tmp_path / "x" / "one.jsonl", _records(1))
    write_jsonl(tmp_path / "x" / "two.jsonl", _records(1))
    files = list_inputs([str(tmp_path / "x" / "*.jsonl")])
    assert [s.name for s in files] == ["one.jsonl", "two.jsonl"]


def test_missing_input_is_an_error_naming_it(tmp_path):
    with pytest.raises(UsageError, match=r"input not found: .*nowhere\.jsonl"):
        list_inputs([str(tmp_path / "nowhere.jsonl")])


def test_unsupported_file_is_an_error(tmp_path):
    path = tmp_path / "corpus.xml"
    path.write_text("<id>1</id>\n")
    with pytest.raises(UsageError) as refused:
        list_inputs([str(path)])
    assert str(refused.value) == (
        f"unsupported input {path}: use .parquet, .jsonl, .jsonl.gz, .json (JSON lines), "
        ".arrow, .jpg, .jpeg, .png, .webp, .gif, .tif, .tiff, .bmp (images), .tar (WebDataset "
        "shards), .csv, .tsv"
    )


def test_directory_without_inputs_is_an_error(tmp_path):
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(UsageError) as refused:
        list_inputs([str(tmp_path)])
    assert str(refused.value) == (
        "no input file (.parquet, .jsonl, .jsonl.gz, .json (JSON lines), .arrow, "
        ".jpg, .jpeg, .png, .webp, .gif, .tif, .tiff, .bmp (images), .tar (WebDataset "
        "shards)) found in "
        f"{tmp_path}; .csv, .tsv files are read when named or matched by a glob"
    )


def test_parquet_units_are_row_groups_and_chunks_stay_small(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", _records(25), row_group_size=10)
    chunks, ids, texts, _ = _read(list_inputs([str(path)]), chunk_size=4)
    assert ids == [f"d{i}" for i in range(25)]
    assert texts[3] == "text number 3"
    assert max(len(c.texts) for c in chunks) == 4
    assert [(c.unit, c.last_in_unit) for c in chunks if c.last_in_unit] == [
        (0, True),
        (1, True),
        (2, True),
    ]
    assert sorted({c.unit for c in chunks}) == [0, 1, 2]


def test_jsonl_units_are_fixed_line_ranges(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", _records(10))
    chunks, ids, _, _ = _read(list_inputs([str(path)]), chunk_size=2, records_per_unit=4)
    assert ids == [f"d{i}" for i in range(10)]
    ends = [(c.unit, c.ids.to_pylist()[-1]) for c in chunks if c.last_in_unit]
    assert ends == [(0, "d3"), (1, "d7"), (2, "d9")]


def test_gzipped_jsonl_reads_like_plain(tmp_path):
    path = tmp_path / "c.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for record in _records(3):
            f.write(json.dumps(record) + "\n")
    _, ids, texts, _ = _read(list_inputs([str(path)]))
    assert ids == ["d0", "d1", "d2"]
    assert texts == ["text number 0", "text number 1", "text number 2"]


def test_ids_without_an_id_column_come_from_file_name_and_position(tmp_path):
    write_jsonl(tmp_path / "sub" / "a.jsonl", [{"text": "x"}, {"text": "y"}])
    write_parquet(tmp_path / "b.parquet", [{"text": "x"}, {"text": "y"}, {"text": "z"}])
    _, ids, _, _ = _read(list_inputs([str(tmp_path)]))
    assert ids == ["b.parquet:0", "b.parquet:1", "b.parquet:2", "sub/a.jsonl:0", "sub/a.jsonl:1"]


def test_integer_ids_stay_integers(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", [{"id": 7, "text": "a"}, {"id": 9, "text": "b"}])
    chunks, ids, _, _ = _read(list_inputs([str(path)]))
    assert ids == [7, 9]
    assert chunks[0].ids.type == pa.int64()


def test_custom_columns(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"key": "k1", "body": "hello"}])
    _, ids, texts, _ = _read(list_inputs([str(path)]), text_column="body", id_column="key")
    assert (ids, texts) == (["k1"], ["hello"])


def test_missing_text_column_lists_the_columns_there_are(tmp_path):
    jsonl = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "body": "x"}])
    with pytest.raises(InputError, match=r"text column 'text' not found in .*columns: id, body"):
        _read(list_inputs([str(jsonl)]))
    parquet = write_parquet(tmp_path / "p" / "c.parquet", [{"id": "a", "content": "x"}])
    with pytest.raises(InputError, match=r"text column 'text' not found in .*columns: id, content"):
        _read(list_inputs([str(parquet)]))


def test_missing_id_column_is_an_error_when_asked_for(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"text": "x"}])
    with pytest.raises(InputError, match="id column 'key' not found"):
        _read(list_inputs([str(path)]), id_column="key")


def test_bad_jsonl_records_are_set_aside_with_line_and_reason(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [
        b'{"id": "a", "text": "fine"}',
        b'{"id": "b", "text": nope}',
        b'{"id": "c", "text": null}',
        b'{"id": "d", "text": 42}',
        b'{"id": "e"}',
        b'{"id": "f", "text": "caf\xe9"}',
        b"",
        b"[1, 2]",
        b'{"id": "g", "text": ""}',
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    _, ids, texts, bad = _read(list_inputs([str(path)]))
    assert ids == ["a", "g"]
    assert texts == ["fine", ""]
    assert [(b.line, b.id, b.reason.split(":")[0]) for b in bad] == [
        (2, None, "malformed JSON"),
        (3, "c", "text is null"),
        (4, "d", "text is of type int, not a string"),
        (5, "e", "no 'text' field"),
        (6, None, "invalid UTF-8 at byte 24"),
        (8, None, "a JSON list, not an object"),
    ]


def test_null_parquet_text_is_set_aside_with_its_row(tmp_path):
    path = write_parquet(
        tmp_path / "c.parquet", [{"id": "a", "text": "x"}, {"id": "b", "text": None}]
    )
    _, ids, _, bad = _read(list_inputs([str(path)]))
    assert ids == ["a"]
    assert [(b.row, b.id, b.reason) for b in bad] == [(1, "b", "text is null")]


def test_non_string_parquet_text_column_is_an_error(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", [{"id": "a", "text": 3}])
    with pytest.raises(InputError, match="holds int64, not strings"):
        _read(list_inputs([str(path)]))


def test_count_records(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", _records(5))
    write_parquet(tmp_path / "b.parquet", _records(4))
    assert count_records(list_inputs([str(tmp_path)])) == 9


def test_files_that_would_give_the_same_ids_are_refused(tmp_path):
    write_jsonl(tmp_path / "d1" / "x.jsonl", [{"text": "a"}])
    write_jsonl(tmp_path / "d2" / "x.jsonl", [{"text": "b"}])
    with pytest.raises(InputError, match=r"would give the same ids \(x\.jsonl:N\)"):
        list_inputs([str(tmp_path / "d1"), str(tmp_path / "d2")])
    assert [s.name for s in list_inputs([str(tmp_path)])] == ["d1/x.jsonl", "d2/x.jsonl"]


def test_done_units_are_skipped(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", _records(25), row_group_size=10)
    write_jsonl(tmp_path / "d.jsonl", _records(10, start=100))
    files = list_inputs([str(tmp_path)])
    done = {"part-00000-000001", "part-00001-000000"}
    _, ids, _, _ = _read(files, done=done, records_per_unit=5)
    assert ids == [f"d{i}" for i in [*range(10), *range(20, 25)]] + [
        f"d{i}" for i in range(105, 110)
    ]
    assert path.exists()


def test_id_type_is_integer_only_when_every_file_has_integer_ids(tmp_path):
    write_parquet(tmp_path / "a" / "x.parquet", [{"id": 1, "text": "a"}])
    write_parquet(tmp_path / "a" / "y.parquet", [{"id": 2, "text": "b"}])
    assert RecordReader(list_inputs([str(tmp_path / "a")])).check() == pa.int64()
    write_jsonl(tmp_path / "a" / "z.jsonl", [{"id": 3, "text": "c"}])
    reader = RecordReader(list_inputs([str(tmp_path / "a")]))
    assert reader.check() == pa.string()
    assert [i for c in reader.read() for i in c.ids.to_pylist()] == ["1", "2", "3"]


def test_a_missing_column_in_a_later_file_fails_before_reading(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"text": "fine"}])
    write_jsonl(tmp_path / "b.jsonl", [{"oops": "no text"}])
    with pytest.raises(InputError, match=r"b\.jsonl from line 1; columns: oops"):
        RecordReader(list_inputs([str(tmp_path)])).check()


def test_unit_names_cover_every_unit(tmp_path):
    write_parquet(tmp_path / "a.parquet", _records(25), row_group_size=10)
    write_jsonl(tmp_path / "b.jsonl", _records(9))
    (tmp_path / "c.jsonl").write_text("")
    names = unit_names(list_inputs([str(tmp_path)]), 4)
    assert names == [
        "part-00000-000000",
        "part-00000-000001",
        "part-00000-000002",
        "part-00001-000000",
        "part-00001-000001",
        "part-00001-000002",
        "part-00002-000000",
    ]


def test_seen_ids_survive_the_merges_of_their_sorted_arrays():
    from bulkembed.sources import IdKey, SeenIds

    seen = SeenIds(IdKey.fresh())
    assert all(seen.add(f"id-{i}") for i in range(50))
    assert not any(seen.add(f"id-{i}") for i in range(50))
    assert seen.add(7) and not seen.add("7")
    # An output's ids read back, an array at a time; integers hash as their decimal form.
    seen.add_all([pa.array([f"out-{i}" for i in range(70_000)]), pa.array([10, 11])])
    assert not seen.add("out-69999") and not seen.add("out-0") and seen.add("out-x")
    assert not seen.add("10") and not seen.add(11) and seen.add(12)


def _siphash(message: bytes, key: bytes, rounds: tuple[int, int], wide: bool) -> bytes:
    """SipHash-c-d of `message`, one message at a time, as its specification writes it: the
    reference the vectorized one is checked against."""
    mask = (1 << 64) - 1

    def rotate(x, bits):
        return ((x << bits) | (x >> (64 - bits))) & mask

    def sip_round(v):
        v[0] = (v[0] + v[1]) & mask
        v[1] = rotate(v[1], 13) ^ v[0]
        v[0] = rotate(v[0], 32)
        v[2] = (v[2] + v[3]) & mask
        v[3] = rotate(v[3], 16) ^ v[2]
        v[0] = (v[0] + v[3]) & mask
        v[3] = rotate(v[3], 21) ^ v[0]
        v[2] = (v[2] + v[1]) & mask
        v[1] = rotate(v[1], 17) ^ v[2]
        v[2] = rotate(v[2], 32)

    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:], "little")
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D]
    v += [k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]
    v[1] ^= 0xEE if wide else 0
    tail = len(message) - len(message) % 8
    blocks = [message[i : i + 8] for i in range(0, tail, 8)]
    blocks.append(message[tail:] + bytes(7 - len(message) % 8) + bytes([len(message) & 0xFF]))
    for block in blocks:
        m = int.from_bytes(block, "little")
        v[3] ^= m
        for _ in range(rounds[0]):
            sip_round(v)
        v[0] ^= m
    v[2] ^= 0xEE if wide else 0xFF
    out = b""
    for mark in (0, 0xDD) if wide else (0,):
        v[1] ^= mark
        for _ in range(rounds[1]):
            sip_round(v)
        out += (v[0] ^ v[1] ^ v[2] ^ v[3]).to_bytes(8, "little")
    return out


def test_the_reference_siphash_gives_the_published_values():
    # SipHash-2-4-128 of the empty message and of bytes 0..14, key bytes 0..15: the first
    # values of the specification's test vectors.
    key = bytes(range(16))
    assert _siphash(b"", key, (2, 4), True).hex() == "a3817f04ba25a8e66df67214c7550293"
    assert _siphash(bytes(range(15)), key, (2, 4), True).hex() == (
        "5493e99933b0a8117e08ec0f97cfc3d9"
    )
    # SipHash-1-3 (64-bit) keyed with zeros is Python's own hash of bytes (but b"", whose
    # hash is 0) with hashing unseeded (PYTHONHASHSEED=0), where Python's hash is SipHash-1-3.
    script = (
        "import sys; print(sys.hash_info.algorithm, [hash(bytes(range(n))) for n in (1, 7, 8, 21)])"
    )
    found = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split(" ", 1)
    if found[0] != "siphash13":
        pytest.skip(f"this Python hashes with {found[0]}")
    expected = [
        int.from_bytes(_siphash(bytes(range(n)), bytes(16), (1, 3), False), "little", signed=True)
        for n in (1, 7, 8, 21)
    ]
    assert found[1].strip() == str([-2 if h == -1 else h for h in expected])


def test_id_hashes_are_keyed_siphash_of_the_ids_bytes():
    from bulkembed.sources import IdKey

    key = IdKey(bytes(range(16)))
    ids = ["a", "a\0", "", "abcdefgh", "abcdefgh\0", "abcdefghi", "ünïcödé ✓", "None", "b" * 70]
    hashes = key.hashes(pa.array(ids))
    assert hashes.shape == (len(ids), 2) and hashes.dtype == np.uint64
    assert [h.astype("<u8").tobytes() for h in hashes] == [
        _siphash(i.encode(), key.secret, (1, 3), True) for i in ids
    ]
    # The same ids in other layouts: a slice, chunks, large strings, a missing id as "None".
    same = hashes.tolist()
    assert key.hashes(pa.array(["x", *ids]).slice(1)).tolist() == same
    chunked = pa.chunked_array([pa.array(ids[:4]), pa.array(ids[4:])])
    assert key.hashes(chunked).tolist() == same
    assert key.hashes(pa.array(ids, pa.large_string())).tolist() == same
    assert key.hashes(pa.array([None, "None"])).tolist() == [same[7]] * 2
    integers = key.hashes(pa.array([-5, 2**40], pa.int64())).tolist()
    assert integers == [key.hash("-5").tolist(), key.hash(2**40).tolist()]
    # Another key, other hashes; the key is not shown.
    assert not (IdKey(bytes(16)).hashes(pa.array(ids)) == hashes).any()
    assert repr(key) == "IdKey(…)"


def test_ids_built_to_collide_without_a_key_do_not_collide_with_one():
    from bulkembed.sources import IdKey

    # These two share the 64-bit hash of an unkeyed MurmurHash3-style mixer.
    first, second = IdKey.fresh().hashes(pa.array(["doc-w1cgoiy0bawv", "doc-cml4yWW]em9["]))
    assert (first != second).all()


def _chunk_records(chunks):
    """(part, ids, positions, bad records) of each chunk, for comparing two reads."""
    return [
        (c.part, c.ids.to_pylist(), list(c.positions), [(b.line, b.reason) for b in c.bad])
        for c in chunks
    ]


@pytest.mark.parametrize("lines", [25, 30, 31])
def test_a_jsonl_unit_read_from_its_offset_equals_the_unit_read_from_the_start(tmp_path, lines):
    """Units of 10 lines, with blank, malformed and multi-byte lines among them; 30 lines
    end exactly at a unit boundary."""
    from bulkembed.batching.units import SkippedUnits
    from bulkembed.sources import unit_offsets

    path = tmp_path / "c.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i in range(lines):
            if i % 7 == 3:
                f.write("\n")
            elif i % 11 == 5:
                f.write('{"text": \n')
            else:
                f.write(json.dumps({"id": f"d{i}", "text": f"é{i}"}, ensure_ascii=False) + "\n")
    files = list_inputs([str(path)])
    offsets = unit_offsets(path, 10)
    assert offsets[:2] == [0, len(b"".join(path.read_bytes().splitlines(True)[:10]))]
    units = unit_names(files, 10)
    assert len(offsets) == len(units) + (lines % 10 == 0)
    for unit, part in enumerate(units):
        only = SkippedUnits(done=(), mine=frozenset([part]))
        reader = RecordReader(files, chunk_size=4, records_per_unit=10)
        expected = _chunk_records(reader.read_file(0, only))
        assert expected and expected[-1][0] == part
        assert _chunk_records(reader.read_unit(0, unit, offsets[unit])) == expected

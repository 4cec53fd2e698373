"""What of the tokenized records goes on to be embedded: first id wins, `--limit`, and
the tokens that stay with each record kept."""

import numpy as np
import pytest
from helpers import write_jsonl, write_parquet

from bulkembed.batching.admission import (
    drop_duplicate_ids,
    fail_on_bad_records,
    leave_id_hashes,
    take,
)
from bulkembed.batching.tokenize import TokenizedChunk
from bulkembed.errors import InputError
from bulkembed.sources import IdKey, RecordReader, SeenIds, list_inputs

KEY = IdKey.fresh()


def _tokenized(chunks):
    """Each record tokenized as (its position, its position + 1000), the second truncated
    when the position is odd; ids hashed as the tokenizer processes hash them."""
    for chunk in chunks:
        chunk.id_hashes = KEY.hashes(chunk.ids)
        positions = np.asarray(chunk.positions, np.int32)
        tokens = np.stack([positions, positions + 1000], axis=1).reshape(-1)
        lengths = np.full(len(chunk), 2, np.int32)
        yield TokenizedChunk(chunk, tokens, lengths, positions % 2 == 1)


def _records(ids):
    return [{"id": i, "text": f"text of {i}"} for i in ids]


def test_take_stops_after_n_documents_and_ends_the_unit(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", _records([f"d{i}" for i in range(5)]))
    write_jsonl(tmp_path / "b.jsonl", _records([f"d{i}" for i in range(5, 10)]))
    reader = RecordReader(list_inputs([str(tmp_path)]), chunk_size=2)
    taken = list(take(_tokenized(reader.read()), 7))
    assert [i for t in taken for i in t.chunk.ids.to_pylist()] == [f"d{i}" for i in range(7)]
    last = taken[-1]
    assert last.chunk.last_in_unit and (last.chunk.file, last.chunk.unit) == (1, 0)
    assert last.token_ids.tolist() == [0, 1000, 1, 1001] and last.truncated == 1
    # The chunk of d5 and d6 (lines 1 and 2 of b.jsonl) cut after d5, with its tokens only.
    last = list(take(_tokenized(reader.read()), 6))[-1]
    assert last.chunk.ids.to_pylist() == ["d5"] and last.token_ids.tolist() == [0, 1000]
    assert last.truncated == 0 and last.chunk.last_in_unit
    assert list(take(_tokenized(reader.read()), 0)) == []


def test_later_records_of_an_id_are_bad_records_and_their_tokens_go(tmp_path):
    ids = ["a", "b", "a", "c", "b", "d"]
    path = write_parquet(tmp_path / "c.parquet", _records(ids))
    reader = RecordReader(list_inputs([str(path)]), chunk_size=4)
    seen = SeenIds(KEY)
    seen.add("d")  # as a done unit's id is
    kept = list(drop_duplicate_ids(_tokenized(reader.read()), seen, reader.files))
    assert [t.chunk.ids.to_pylist() for t in kept] == [["a", "b", "c"], []]
    assert [t.token_ids.tolist() for t in kept] == [[0, 1000, 1, 1001, 3, 1003], []]
    assert [t.truncated_rows.tolist() for t in kept] == [[False, True, True], []]
    assert [t.chunk.positions.tolist() for t in kept] == [[0, 1, 3], []]
    bad = [(b.row, b.id, b.reason) for t in kept for b in t.chunk.bad]
    assert [(row, doc_id) for row, doc_id, _ in bad] == [(2, "a"), (4, "b"), (5, "d")]
    assert all(reason.startswith("duplicate id") for _, _, reason in bad)


def _hashes(*pairs):
    return np.array(pairs, np.uint64).reshape(-1, 2)


def test_seen_ids_find_repeats_within_one_array_and_across_calls():
    seen = SeenIds(KEY)
    first = seen.add_hashes(_hashes((5, 0), (3, 0), (5, 0), (9, 0), (3, 0)))
    assert first.tolist() == [True, True, False, True, False]
    assert seen.add_hashes(_hashes((9, 0), (4, 0), (4, 0))).tolist() == [False, True, False]


def test_seen_ids_tell_apart_hashes_of_one_first_word():
    # Ids whose first words tie (by chance) are told apart by the second, within one array,
    # across calls and across the merges of their sorted levels.
    seen = SeenIds(KEY)
    first = seen.add_hashes(_hashes((7, 1), (7, 2), (7, 1), (2, 2)))
    assert first.tolist() == [True, True, False, True]
    assert seen.add_hashes(_hashes((7, 3), (7, 2), (2, 1))).tolist() == [True, False, True]
    seen.add_hashes(_hashes(*((n, 0) for n in range(100, 200))))
    held = seen.contains(
        _hashes((7, 1), (7, 2), (7, 3), (7, 4), (2, 1), (2, 2), (150, 0), (150, 1))
    )
    assert held.tolist() == [True, True, True, False, True, True, True, False]


def test_fail_on_bad_records_names_the_first_one(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", _records(["a", "a"]))
    reader = RecordReader(list_inputs([str(path)]))
    chunks = drop_duplicate_ids(_tokenized(reader.read()), SeenIds(KEY), reader.files)
    with pytest.raises(InputError, match=r"a.jsonl line 2: duplicate id"):
        list(fail_on_bad_records(chunks))


def test_what_goes_on_to_the_devices_has_no_id_hashes(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", _records(["a", "b"]))
    (tokenized,) = leave_id_hashes(_tokenized(RecordReader(list_inputs([str(tmp_path)])).read()))
    assert tokenized.chunk.id_hashes is None
    assert tokenized.chunk.ids.to_pylist() == ["a", "b"]

"""Texts far longer than a model reads: cut before they are tokenized, their tokens and
vectors those of the whole text, their content hash over every byte; a text that cannot be
cut so is set aside, never embedded from a start that may differ."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import content_hash, cosines, run_cli, sample_texts, write_jsonl, write_parquet
from hypothesis import given, settings
from hypothesis import strategies as st

from bulkembed.batching.tokenize import (
    CUT,
    NOT_CUT_EXACTLY,
    WHOLE,
    TextTokenizer,
    TokenizerSettings,
)
from bulkembed.sources import Chunk
from bulkembed.sources.long_texts import MARGIN, TextCut, reader_bound, tokenizer_bound

MAX_LENGTH = 64


def _long_text(characters: int, seed: int = 0) -> str:
    """Words of the sample, in a random order, to `characters` characters."""
    rng = random.Random(seed)
    words = " ".join(sample_texts(200)).split()
    found, size = [], 0
    while size < characters:
        word = rng.choice(words)
        found.append(word)
        size += len(word) + 1
    return " ".join(found)[:characters]


def _settings(folder, max_length=MAX_LENGTH, prompt="", lowercase=False):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return TokenizerSettings(tokenizer.backend_tokenizer.to_str(), max_length, prompt, lowercase)


@pytest.mark.parametrize("model", ["tiny_bert", "minilm"])
def test_a_cut_text_keeps_the_whole_texts_tokens(request, model):
    from transformers import AutoTokenizer

    folder = request.getfixturevalue(model)
    reference = AutoTokenizer.from_pretrained(folder)
    texts = [_long_text(n, seed) for seed, n in enumerate((100, 30_000, 200_000))]
    # A word that no tokenizer piece covers whole, across where the text is cut first.
    bound = tokenizer_bound(MAX_LENGTH)
    texts.append(_long_text(bound - 40) + " " + "x" * 200 + " " + _long_text(5_000, 9))
    for prompt, lowercase in (("", False), ("passage: ", True)):
        settings = _settings(folder, prompt=prompt, lowercase=lowercase)
        flat, lengths, truncated, read = TextTokenizer(settings)._encoded(
            [settings.model_text(t) for t in texts]
        )
        expected = reference(
            [settings.model_text(t) for t in texts], truncation=True, max_length=MAX_LENGTH
        )["input_ids"]
        assert [ids.tolist() for ids in np.split(flat, np.cumsum(lengths)[:-1])] == expected
        assert read.tolist() == [WHOLE, CUT, CUT, CUT]
        assert truncated.tolist() == [False, True, True, True]


def test_the_reader_cuts_a_giant_text_and_hashes_all_of_it():
    cut = TextCut(1000, prompt="passage: ")
    giant = "é" * 600 + _long_text(5000)
    chunk = Chunk(0, 0, pa.array(["a", "b", "c"]), pa.array(["short", giant, "x"]), True)
    cut.apply(chunk)
    assert chunk.texts.to_pylist() == ["short", giant[:1000], "x"]
    assert [bytes(h).hex() for h in chunk.hashes] == [
        "",
        content_hash("passage: " + giant),
        "",
    ]
    lowered = TextCut(1000, prompt="Passage: ", lowercase=True)
    shouting = "ΣΑΣ ΟΔΟΣ " * 300
    chunk = Chunk(0, 0, pa.array(["a"]), pa.array([shouting]), True)
    lowered.apply(chunk)
    assert bytes(chunk.hashes[0]).hex() == content_hash(("Passage: " + shouting).lower())
    # A text of more bytes than the bound but no more characters is not cut.
    chunk = Chunk(0, 0, pa.array(["a"]), pa.array(["é" * 900]), True)
    cut.apply(chunk)
    assert chunk.texts.to_pylist() == ["é" * 900] and not len(chunk.hashes)


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_giant_record_is_cut_counted_and_embedded_as_its_whole_text(tmp_path, tiny_st, kind):
    from sentence_transformers import SentenceTransformer

    model = tiny_st("mean")
    giant = _long_text(reader_bound(MAX_LENGTH) * 3)
    records = [{"id": f"d{i}", "text": t} for i, t in enumerate(sample_texts(30))]
    records.insert(10, {"id": "giant", "text": giant})
    if kind == "jsonl":
        corpus = write_jsonl(tmp_path / "c.jsonl", records)
    else:
        corpus = write_parquet(tmp_path / "c.parquet", records, row_group_size=8)
    out = tmp_path / "out"
    settings = ("--dtype", "float32", "--max-length", str(MAX_LENGTH))
    result = run_cli(corpus, model, out, *settings)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    # The giant text, and the sample's texts too long to be tokenized whole.
    long = 1 + sum(
        len(r["text"]) > tokenizer_bound(MAX_LENGTH) for r in records[:10] + records[11:]
    )
    assert (summary["docs"], summary["cut"], summary["bad_records"]) == (31, long, 0)
    assert long > 1
    table = pq.read_table(out).sort_by("id")
    row = table.column("id").to_pylist().index("giant")
    assert table.column("content_hash")[row].as_py() == content_hash(giant)
    reference = SentenceTransformer(str(model), device="cpu")
    reference.max_seq_length = MAX_LENGTH
    expected = reference.encode([giant], convert_to_numpy=True)
    found = np.array(table.column("dense")[row].as_py())[None, :]
    assert cosines(found, expected).min() > 0.99999


def test_a_giant_text_whose_tokens_lie_past_the_cut_is_set_aside(tmp_path, tiny_st):
    blank = " " * reader_bound(MAX_LENGTH)
    records = [
        {"id": "a", "text": "before"},
        {"id": "blank", "text": "a few words" + blank + "and the rest of the text " * 50},
        {"id": "b", "text": "after"},
    ]
    corpus = write_jsonl(tmp_path / "c.jsonl", records)
    out = tmp_path / "out"
    result = run_cli(corpus, tiny_st("mean"), out, "--max-length", str(MAX_LENGTH))
    assert result.exit_code == 0, result.output
    assert sorted(pq.read_table(out).column("id").to_pylist()) == ["a", "b"]
    quarantined = [json.loads(line) for line in (out / "_bulkembed" / "bad_records.jsonl").open()]
    assert [(q["id"], q["line"]) for q in quarantined] == [("blank", 2)]
    assert quarantined[0]["reason"] == (
        f"text too long to read whole, whose first tokens do not end {MARGIN:,} characters "
        "before where it was cut: it is not embedded from a start that may differ"
    )


def test_a_text_the_reader_cut_is_not_cut_exactly_where_its_tokens_reach_the_cut(tiny_bert):
    settings = _settings(tiny_bert)
    text = "word " * 5 + " " * (tokenizer_bound(MAX_LENGTH) * 2)
    tokenizer = TextTokenizer(settings)
    *_, read = tokenizer._encoded([text], np.array([True]))
    assert read.tolist() == [NOT_CUT_EXACTLY]
    *_, read = tokenizer._encoded([text], np.array([False]))
    assert read.tolist() == [WHOLE]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(min_size=0, max_size=300),
    others=st.dictionaries(st.text(max_size=6), _JSON, max_size=4),
    keep=st.integers(1, 50),
    ascii_only=st.booleans(),
    spaced=st.booleans(),
)
def test_a_long_line_read_in_place_is_what_json_reads(text, others, keep, ascii_only, spaced):
    from bulkembed.sources import long_lines
    from bulkembed.sources.long_texts import ContentHash

    record = {**others, "text": text}
    separators = (" , ", " : ") if spaced else (",", ":")
    line = json.dumps(record, ensure_ascii=ascii_only, separators=separators).encode() + b"\n"
    found = long_lines.scan(bytearray(line), "text", keep, ContentHash("q: ", False))
    expected = json.loads(line)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        assert found is None  # an unpaired surrogate: the other parsers say so
        return
    assert found is not None
    assert found.record == {**expected, "text": text[:keep]}
    assert found.digest.hex() == content_hash("q: " + text)


def test_a_long_line_is_decoded_a_piece_at_a_time(monkeypatch):
    from bulkembed.sources import long_lines
    from bulkembed.sources.long_texts import ContentHash

    monkeypatch.setattr(long_lines, "_PIECE", 7)
    text = 'é"\\\n\t' * 40 + "\U0001f600 ☃ \ud7ff" * 30
    for ascii_only in (True, False):
        line = json.dumps({"id": 1, "text": text}, ensure_ascii=ascii_only).encode()
        found = long_lines.scan(bytearray(line), "text", 1000, ContentHash("", False))
        assert found is not None and found.record == {"id": 1, "text": text}
        assert found.digest.hex() == content_hash(text)
    for broken in (b'{"id": 1, "text": "a"', b'{"id": 1 "text": "a"}', b'["text"]', b'{"a": 1} x'):
        assert long_lines.scan(bytearray(broken), "text", 10, ContentHash("", False)) is None


def test_a_long_line_that_is_not_plainly_valid_is_read_by_the_line_path(tmp_path):
    from bulkembed.sources import RecordReader, list_inputs

    text = _long_text(5_000)
    lines = [
        json.dumps({"id": "ok", "text": text}).encode(),
        json.dumps({"id": "bytes", "text": text, "meta": "x"}).encode().replace(b'"x"', b'"\xff"'),
        b'{"id": "deep", "text": "t", "meta": ' + b"[" * 3000 + b"]" * 3000 + b"}",
        json.dumps({"id": "lone", "text": text + "\ud800"}).encode(),
    ]
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\n".join(line + b" " * 2_000 for line in lines) + b"\n")
    reader = RecordReader(list_inputs([str(path)]), text_cut=TextCut(1_000))
    chunks = list(reader.read())
    kept = [i for c in chunks for i in c.ids.to_pylist()]
    bad = [(b.line, b.reason.split(" at ")[0]) for c in chunks for b in c.bad]
    assert kept == ["ok"]
    assert bad == [
        (2, "invalid UTF-8"),
        (3, "JSON nested too deeply to read"),
        (4, "text holds an unpaired surrogate"),
    ]

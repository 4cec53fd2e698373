"""Run modes on their own: what a plain and an incremental run answer the engines, with no
model running (the previous output is made by a run beforehand)."""

import json
import pickle
import time

import numpy as np
import pyarrow as pa
import pytest
from helpers import incremental_corpora, run_cli

from bulkembed.batching.tokenize import TextTokenizer
from bulkembed.config import RunConfig
from bulkembed.engine.modes import ChangeSetRun, PlainRun, no_upserts
from bulkembed.engine.plan import plan_run
from bulkembed.reporting.progress import QuietReporter
from bulkembed.sources import Chunk


def _plan(tmp_path, model, since=None):
    config = RunConfig(
        inputs=(str(tmp_path / "v2"),),
        output=str(tmp_path / "out-v2"),
        model=str(model),
        dtype="float32",
        tokenize_workers=0,
        since=None if since is None else str(since),
    )
    return plan_run(config, QuietReporter(), time.monotonic())


def _open(plan):
    """The plan's mode, opening the output as a run does."""
    return plan.mode.open(plan, QuietReporter())


def _tokenized(plan, ids, texts, lookup=None):
    """A chunk of `texts` tokenized as a tokenizer process would, with `lookup` (a
    previous output's) leaving the unchanged ones untokenized."""
    from bulkembed.batching.tokenize import _tokenized

    chunk = Chunk(0, 0, pa.array(ids), pa.array(texts), True)
    chunk.positions = np.arange(len(ids), dtype=np.int64)
    tokenizer = TextTokenizer(plan.tokenizer_settings, lookup, plan.id_key)
    return _tokenized(chunk, tokenizer.timed((chunk.texts, chunk.ids, chunk.hashes)))


def test_a_plain_run_carries_nothing_and_ends_with_nothing(tmp_path, tiny_st):
    incremental_corpora(tmp_path)
    plan = _plan(tmp_path, tiny_st("mean"))
    mode = plan.mode
    assert isinstance(mode, PlainRun)
    with _open(plan) as opened:
        assert (opened.done, opened.complete) == ({}, False)
        assert (mode.carrier().lookup, mode.describe(), mode.changes()) == (None, "", None)
        assert mode.upserts() is no_upserts and no_upserts() is None
        assert mode.end(print) is None
        pending = mode.pending({"part-00000-000000": None})
        assert "part-00000-000001" in pending and "part-00000-000000" not in pending
        chunk = _tokenized(plan, ["a", "b"], ["one text", "another text"])
        assert list(mode.carrier().carry([chunk])) == [chunk]
        assert chunk.chunk.carried is None and len(chunk.lengths) == 2
        assert opened.run.lock_holder() is not None
        # A plain run keeps no state of its mode.
        assert not opened.run.mode_path.exists()
    assert opened.run.lock_holder() is None


def test_an_incremental_run_carries_unchanged_rows_and_ends_with_the_deletes(tmp_path, tiny_st):
    model = tiny_st("mean")
    kinds = incremental_corpora(tmp_path)
    assert run_cli(tmp_path / "v1", model, tmp_path / "out-v1", "--dtype", "float32").exit_code == 0
    previous = pa.Table.from_batches(
        [b for p in sorted((tmp_path / "out-v1").glob("*.parquet")) for b in _batches(p)]
    )
    texts = _texts(tmp_path / "v1")

    plan = _plan(tmp_path, model, since=tmp_path / "out-v1")
    mode = plan.mode
    assert isinstance(mode, ChangeSetRun)
    with _open(plan) as opened:
        run = opened.run
        assert opened.complete is False
        assert mode.changes().rows == 1000
        assert "reusing the vectors of 1,000 documents" in mode.describe()
        assert mode.upserts() is not no_upserts

        changed = sorted(kinds["changed"])[0]
        ids = ["doc-0", changed, "brand-new", "doc-1"]
        chunk_texts = [texts["doc-0"], texts[changed] + " (edited)", "a new text", texts["doc-1"]]
        chunk = _tokenized(plan, ids, chunk_texts, mode.carrier().lookup)
        # The tokenizer left the two unchanged texts alone: their counts come from before.
        assert chunk.untokenized.tolist() == [True, False, False, True]
        assert chunk.lengths[[0, 3]].tolist() == [0, 0]

        # Pickled into another process (a Ray task), the carrier opens the same lookup and
        # carries the same rows.
        elsewhere = pickle.loads(pickle.dumps(mode.carrier()))
        assert elsewhere.lookup is not mode.carrier().lookup
        again = _tokenized(plan, ids, chunk_texts, elsewhere.lookup)
        assert again.untokenized.tolist() == [True, False, False, True]
        (carried_elsewhere,) = elsewhere.carry([again])
        (carried,) = mode.carrier().carry([chunk])
        assert carried_elsewhere.chunk.carried.embeddings.equals(carried.chunk.carried.embeddings)
        assert carried.chunk.ids.to_pylist() == [changed, "brand-new"]
        assert carried.chunk.changed == 1
        kept = carried.chunk.carried
        assert kept.records.ids.to_pylist() == ["doc-0", "doc-1"]
        before = {i: v for i, v in zip(*_columns(previous, "id", "dense"), strict=True)}
        assert kept.embeddings.column("dense").to_pylist() == [before["doc-0"], before["doc-1"]]
        full = _tokenized(plan, ["doc-0", "doc-1"], [texts["doc-0"], texts["doc-1"]])
        assert kept.counts.tokens.tolist() == full.lengths.tolist()
        assert carried.carried_tokens == int(full.lengths.sum())

        # The end step is a change set's: the deletes once every unit is done. What the
        # mode keeps across restarts is in its own file, not in the configuration.
        assert mode.end(print) is not None
        state = json.loads(run.mode_path.read_text())
        assert state == {"previous_rows": 1000, "deletions": None, "ended": False}
        assert "previous_rows" not in run.read_config()
    assert run.lock_holder() is None
    assert not mode.carrier().lookup.folder.exists()


def test_an_end_step_another_shard_began_is_kept(tmp_path, tiny_st):
    model = tiny_st("mean")
    incremental_corpora(tmp_path)
    assert run_cli(tmp_path / "v1", model, tmp_path / "out-v1", "--dtype", "float32").exit_code == 0
    plan = _plan(tmp_path, model, since=tmp_path / "out-v1")
    with _open(plan) as opened:
        pass
    # Another shard began the end step meanwhile: its decision is kept, not written over.
    noted = {"deleted": 2, "kept": 0, "withheld": 0, "held_by": None}
    state = {"previous_rows": 1000, "deletions": None, "ended": True}
    opened.run.write_mode_state({**state, "deletions": noted})
    again = _plan(tmp_path, model, since=tmp_path / "out-v1")
    with _open(again):
        assert (again.mode.deletions.as_dict(), again.mode.ended) == (noted, True)
    assert json.loads(opened.run.mode_path.read_text())["deletions"] == noted


def _batches(path):
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=["id", "dense"]).to_batches()


def _columns(table, *names):
    return [table.column(n).to_pylist() for n in names]


def _texts(folder):
    """The texts of a corpus written by `incremental_corpora`, by id."""
    import pyarrow.parquet as pq

    table = pq.read_table(folder / "a.parquet")
    texts = dict(zip(*_columns(table, "id", "text"), strict=True))
    for line in (folder / "b.jsonl").read_text().splitlines():
        record = json.loads(line)
        texts[record["id"]] = record["text"]
    return texts


@pytest.mark.parametrize("limit", [None, 5])
def test_an_incremental_run_with_a_limit_deletes_nothing(tmp_path, tiny_st, limit):
    model = tiny_st("mean")
    incremental_corpora(tmp_path)
    assert run_cli(tmp_path / "v1", model, tmp_path / "out-v1", "--dtype", "float32").exit_code == 0
    plan = _plan(tmp_path, model, since=tmp_path / "out-v1")
    if limit is not None:
        from dataclasses import replace

        plan = replace(plan, config=plan.config.changed(limit=limit))
    with _open(plan):
        assert (plan.mode.end(print) is None) == (limit is not None)

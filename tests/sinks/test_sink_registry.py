"""A kind of output written here, registered, and run into: the engine asks only the registry
and the capabilities, so a sink of this file runs and resumes as the built-in ones do."""

from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import write_jsonl

from bulkembed.config import RunConfig
from bulkembed.contracts import UnitRecord
from bulkembed.engine.run import embed_corpus
from bulkembed.errors import OutputError, UsageError
from bulkembed.sinks import (
    Capabilities,
    OutputTarget,
    Recovered,
    Sink,
    SinkKind,
    SinkSettings,
    parse_output,
    register_sink,
    unregister_sink,
)

SCHEME = "memory://"
DOCS = 50
PER_UNIT = 10


class MemorySink(Sink):
    """Committed parts kept in a dict, by part name; `fail_at` commits in, it fails once."""

    def __init__(self, parts: dict[str, pa.Table], fail_at: list[int]) -> None:
        self.parts = parts
        self.fail_at = fail_at
        self.commits = 0
        self.schema: pa.Schema | None = None
        self._pending: dict[str, list[pa.RecordBatch]] = {}
        self._fence: Callable[[], None] = lambda: None

    @property
    def description(self) -> str:
        return "memory"

    def start(self, schema: pa.Schema, fence: Callable[[], None] = lambda: None) -> None:
        self.schema, self._fence = schema, fence

    def write(self, part: str, batch: pa.RecordBatch) -> None:
        self._pending.setdefault(part, []).append(batch)

    def commit(self, part: str, label: dict[str, Any]) -> dict[str, Any]:
        self.commits += 1
        if self.fail_at and self.commits == self.fail_at[0]:
            self.fail_at.pop()
            raise OutputError("memory: the store went away")
        batches = self._pending.pop(part, [])
        self._fence()
        if batches:
            self.parts[part] = pa.Table.from_batches(batches, self.schema)
        return {}

    def reconcile(
        self, done: dict[str, UnitRecord], run: str, mine: Collection[str] | None = None
    ) -> Recovered:
        for part in [p for p in self.parts if p not in done]:
            del self.parts[part]
        return Recovered(lost=[p for p, r in done.items() if r.rows and p not in self.parts])

    def committed_ids(self, done: dict[str, UnitRecord]) -> Iterator[pa.Array]:
        for part in done:
            if part in self.parts:
                yield from self.parts[part].column("id").chunks

    def remove(self, marked: Collection[str]) -> None:
        self.parts.clear()

    def close(self) -> None:
        self._pending.clear()


@pytest.fixture
def memory(tmp_path):
    """The `memory://NAME` kind: its stores by name, its ledgers under `tmp_path`, and the
    commits at which the next sink opened fails."""
    stores: dict[str, dict[str, pa.Table]] = {}
    fail_at: list[int] = []

    def parse(output: str, options: Any) -> OutputTarget | None:
        if not output.startswith(SCHEME):
            return None
        name = output.removeprefix(SCHEME)
        return OutputTarget("memory", output, None, name, tmp_path / "ledgers" / name)

    def open_sink(target: OutputTarget, settings: SinkSettings) -> Sink:
        assert target.name is not None
        return MemorySink(stores.setdefault(target.name, {}), fail_at)

    register_sink(SinkKind("memory", parse, open_sink, Capabilities()))
    yield stores, fail_at
    unregister_sink("memory")


def _config(corpus, model, output: str, **options: Any) -> RunConfig:
    return RunConfig(
        inputs=(str(corpus),),
        output=output,
        model=str(model),
        dtype="float32",
        records_per_unit=PER_UNIT,
        tokenize_workers=0,
        **options,
    )


def _rows(table: pa.Table) -> dict[str, list[float]]:
    return dict(zip(table.column("id").to_pylist(), table.column("dense").to_pylist(), strict=True))


def test_a_registered_sink_is_written_and_resumed(tmp_path, tiny_st, memory):
    stores, fail_at = memory
    topics = ("lists", "tuples", "sets")
    texts = [f"document {i} about {topics[i % 3]}" for i in range(DOCS)]
    corpus = write_jsonl(
        tmp_path / "c.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)]
    )
    model = tiny_st("mean")
    assert parse_output("memory://news").kind == "memory"

    fail_at.append(3)
    with pytest.raises(OutputError, match="memory: the store went away"):
        embed_corpus(_config(corpus, model, "memory://news"))
    assert len(stores["news"]) == 2  # the units committed before the failure
    resumed = embed_corpus(_config(corpus, model, "memory://news"))
    assert (resumed.docs, resumed.docs_this_run) == (DOCS, DOCS - 2 * PER_UNIT)
    assert sorted(stores["news"]) == sorted(resumed_parts(tmp_path / "ledgers" / "news"))

    held = _rows(pa.concat_tables(stores["news"].values()))
    assert sorted(held) == sorted(f"d{i}" for i in range(DOCS))  # each id once
    embed_corpus(_config(corpus, model, str(tmp_path / "parquet")))
    reference = _rows(pq.read_table(tmp_path / "parquet"))
    assert all(np.array_equal(held[i], reference[i]) for i in reference)

    again = embed_corpus(_config(corpus, model, "memory://news"))
    assert again.docs_this_run == 0  # complete: nothing is embedded again


def resumed_parts(ledger) -> list[str]:
    """The parts the ledger marks done."""
    return [p.stem for p in (ledger / "done").glob("*.json")]


def test_options_a_kind_cannot_take_are_refused(tmp_path, tiny_st, memory):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "one"}])
    model = tiny_st("mean")
    with pytest.raises(UsageError, match="--shard writes from several processes, and memory://x"):
        embed_corpus(_config(corpus, model, "memory://x", shard="0/2"))
    with pytest.raises(UsageError, match="apply to an output that keeps indexes"):
        embed_corpus(_config(corpus, model, "memory://x", index=True))
    with pytest.raises(UsageError, match="memory://x cannot be synced in place"):
        from bulkembed.sinks import in_place, make_sink

        target = parse_output("memory://x")
        in_place(target, make_sink(target, SinkSettings()))


def test_a_kind_must_say_where_its_ledger_lives_exactly_when_it_resumes(tmp_path):
    def parse(output: str, options: Any) -> OutputTarget | None:
        return OutputTarget("careless", output) if output.startswith("careless://") else None

    register_sink(SinkKind("careless", parse, lambda t, s: MemorySink({}, []), Capabilities()))
    try:
        with pytest.raises(ValueError, match="a resumable kind names its target's run directory"):
            parse_output("careless://x")
    finally:
        unregister_sink("careless")
    for declared in (Capabilities(in_place=True), Capabilities(change_set=True)):
        with pytest.raises(ValueError, match="in_place and change_set are not declared"):
            SinkKind("half", parse, lambda t, s: MemorySink({}, []), declared)


def test_the_capabilities_that_come_with_something_to_give_follow_from_giving_it():
    from bulkembed.sinks import sink_kind

    parquet, lancedb, stdout = (sink_kind(name) for name in ("parquet", "lancedb", "stdout"))
    assert (parquet.capabilities.change_set, parquet.capabilities.in_place) == (True, False)
    assert (lancedb.capabilities.change_set, lancedb.capabilities.in_place) == (False, True)
    assert (stdout.capabilities.change_set, stdout.capabilities.in_place) == (False, False)
    assert parquet.change_set is not None and lancedb.in_place is not None


def test_a_process_sink_writes_where_this_process_resolved_the_output(tmp_path, monkeypatch):
    from bulkembed.sinks.parquet import ParquetSink

    monkeypatch.chdir(tmp_path)
    make = ParquetSink(Path("out")).process_copies()
    monkeypatch.chdir(tmp_path.parent)  # a Ray actor's working directory is its own
    assert make().directory == tmp_path / "out"

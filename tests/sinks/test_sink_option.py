"""A kind of output with a setting of its own, added in this file alone: `rounded://NAME`
keeps vectors rounded to `?decimals=N` places (default `BULKEMBED_ROUNDED_DECIMALS`, else
3), its target carrying the setting from `--output` to the sink it opens; a wrong value is
the kind's own one-line error, from the CLI and from Python alike."""

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers import run_cli, write_jsonl

from bulkembed.config import RunConfig
from bulkembed.engine.run import embed_corpus
from bulkembed.errors import UsageError
from bulkembed.sinks import (
    Capabilities,
    OutputTarget,
    Sink,
    SinkKind,
    SinkSettings,
    register_sink,
    unregister_sink,
)

SCHEME = "rounded://"
DECIMALS_VARIABLE = "BULKEMBED_ROUNDED_DECIMALS"


@dataclass(frozen=True, slots=True)
class RoundedTarget(OutputTarget):
    """An output of the `rounded` kind: the target, and the places its vectors keep."""

    decimals: int = 3


def _decimals(text: str, output: str) -> int:
    if not text.isdigit():
        raise UsageError(f"--output {output}: decimals must be a whole number, not {text!r}")
    return int(text)


class RoundedSink(Sink):
    """Committed parts kept in a dict by part name, their vectors rounded."""

    def __init__(self, parts: dict[str, pa.Table], decimals: int) -> None:
        self.parts, self.decimals = parts, decimals
        self.schema: pa.Schema | None = None
        self._pending: dict[str, list[pa.RecordBatch]] = {}

    @property
    def description(self) -> str:
        return f"rounded to {self.decimals} places"

    def start(self, schema: pa.Schema, fence: Callable[[], None] = lambda: None) -> None:
        self.schema = schema

    def write(self, part: str, batch: pa.RecordBatch) -> None:
        self._pending.setdefault(part, []).append(batch)

    def commit(self, part: str, label: dict[str, Any]) -> dict[str, Any]:
        batches = self._pending.pop(part, [])
        if batches:
            table = pa.Table.from_batches(batches, self.schema)
            dense = table.column("dense").combine_chunks()
            rounded = pc.round(dense.flatten(), self.decimals).cast(dense.type.value_type)
            vectors = pa.FixedSizeListArray.from_arrays(rounded, dense.type.list_size)
            self.parts[part] = table.set_column(
                table.schema.get_field_index("dense"), "dense", vectors
            )
        return {}

    def close(self) -> None:
        self._pending.clear()


@pytest.fixture
def rounded(tmp_path):
    """The `rounded://NAME` kind, registered for the test: its stores by name."""
    stores: dict[str, dict[str, pa.Table]] = {}

    def parse(output: str, options: Any) -> OutputTarget | None:
        if not output.startswith(SCHEME):
            return None
        where = urlsplit(output)
        given = parse_qs(where.query).get("decimals", [os.environ.get(DECIMALS_VARIABLE, "3")])
        ledger = tmp_path / "ledgers" / where.netloc
        return RoundedTarget(
            "rounded", output, None, where.netloc, ledger, _decimals(given[0], output)
        )

    def open_sink(target: OutputTarget, settings: SinkSettings) -> Sink:
        assert isinstance(target, RoundedTarget) and target.name is not None
        return RoundedSink(stores.setdefault(target.name, {}), target.decimals)

    register_sink(SinkKind("rounded", parse, open_sink, Capabilities()))
    yield stores
    unregister_sink("rounded")


def _vectors(store: dict[str, pa.Table]) -> np.ndarray:
    table = pa.concat_tables(store[p] for p in sorted(store))
    return np.array(table.column("dense").to_pylist(), dtype=np.float32)


def _round(vectors: np.ndarray, decimals: int) -> np.ndarray:
    """`vectors` rounded to `decimals` places, as float32 holds them."""
    return np.round(vectors.astype(np.float64), decimals).astype(np.float32)


def test_a_sink_kind_takes_its_own_setting_from_the_output_and_its_variable(
    tmp_path, tiny_st, rounded, monkeypatch
):
    corpus = write_jsonl(
        tmp_path / "c.jsonl", [{"id": f"d{i}", "text": f"text {i}"} for i in range(12)]
    )
    model = tiny_st("mean")
    config = dict(inputs=(str(corpus),), model=str(model), dtype="float32", tokenize_workers=0)
    embed_corpus(RunConfig(output="rounded://two?decimals=2", **config))
    two = _vectors(rounded["two"])
    assert len(two) == 12 and np.array_equal(two, _round(two, 2))
    assert not np.array_equal(two, _round(two, 1))
    monkeypatch.setenv(DECIMALS_VARIABLE, "1")
    embed_corpus(RunConfig(output="rounded://one", **config))
    one = _vectors(rounded["one"])
    assert np.abs(one - two).max() <= 0.1 + 1e-6
    assert np.array_equal(one, _round(one, 1))
    # A wrong value: the kind's one line, from the command line and from Python.
    result = run_cli(corpus, model, "rounded://bad?decimals=many")
    assert result.exit_code == 2
    expected = "--output rounded://bad?decimals=many: decimals must be a whole number, not 'many'"
    assert result.output.strip() == f"error: {expected}"
    with pytest.raises(UsageError, match="decimals must be a whole number"):
        embed_corpus(RunConfig(output="rounded://bad?decimals=many", **config))

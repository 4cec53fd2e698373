"""Random sequences of crashes and damage during incremental runs over damaged inputs: an
input file cut short, a malformed record. Whatever happens, no id that the input still
holds is ever deleted (from the change set, or from a table synced in place), and the last
run ends as an uninterrupted run over the same inputs does, or refuses in one line naming
what it found."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import HARNESS, sample_texts, write_jsonl, write_parquet
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_crash_sequences import DAMAGE, SEQUENCES, crash_sequence
from typer.testing import CliRunner

from bulkembed.cli import app

# Units of the input: 4 row groups in each Parquet file, 1 JSON-lines unit.
UNITS = 9
GONE = ("doc-5", "doc-21")  # deleted from a.parquet, which is never damaged
INPUT_DAMAGES = ("none", "cut-parquet", "cut-jsonl", "malformed")


def _records() -> list[dict]:
    """72 records, some with a null text, some repeating an earlier id."""
    records = [{"id": f"doc-{i}", "text": t} for i, t in enumerate(sample_texts(72))]
    for record in records[2:60:9]:
        record["text"] = None
    for record in records[40:44]:
        record["id"] = f"doc-{int(record['id'][4:]) - 30}"
    return records


def _write(folder: Path, records: list[dict]) -> Path:
    write_parquet(folder / "a.parquet", records[:32], row_group_size=8)
    write_parquet(folder / "b.parquet", records[32:64], row_group_size=8)
    write_jsonl(folder / "c.jsonl", records[64:])
    return folder


def _next_version(records: list[dict]) -> list[dict]:
    """Three texts changed, two records deleted, two added (in c.jsonl)."""
    changed = [dict(r) for r in records if r["id"] not in GONE]
    for record in changed[10:70:25]:
        if record["text"] is not None:
            record["text"] += " (edited)"
    return changed + [{"id": f"new-{i}", "text": f"a new document {i}"} for i in range(2)]


def _damage_input(corpus: Path, damage: str) -> None:
    if damage == "cut-parquet":
        data = (corpus / "b.parquet").read_bytes()
        (corpus / "b.parquet").write_bytes(data[: len(data) // 3])
    elif damage == "cut-jsonl":
        data = (corpus / "c.jsonl").read_bytes()
        (corpus / "c.jsonl").write_bytes(data[: len(data) // 2])
    elif damage == "malformed":
        lines = (corpus / "c.jsonl").read_text().splitlines(keepends=True)
        lines[3] = lines[3][:20] + "\n"
        (corpus / "c.jsonl").write_text("".join(lines))


def _arguments(corpus: Path, model: Path, out: str, since: str | None = None) -> list[str]:
    arguments = [
        "run", str(corpus), "--model", str(model), "--output", out, "--quiet",
        "--dtype", "float32", "--tokenize-workers", "0", "--max-batch-tokens", "256",
    ]  # fmt: skip
    return arguments if since is None else [*arguments, "--since", since]


def _table(db: Path):
    import lancedb

    return lancedb.connect(db).open_table("docs").to_arrow()


def _vectors(table) -> dict:
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "an id appears more than once in the output"
    column = "vector" if "vector" in table.schema.names else "dense"
    return dict(zip(ids, np.array(table.column(column).to_pylist()), strict=True))


class _Versions:
    """The previous corpus and its outputs (Parquet, LanceDB table), the next corpus's ids
    (which no damage may delete), and an uninterrupted run over each damaged next corpus."""

    def __init__(self, folder: Path, model: Path) -> None:
        self.folder, self.model = folder, model
        records = _records()
        _write(folder / "v1", records)
        self.previous = folder / "out-v1"
        self.table = folder / "db-v1"
        for out in (str(self.previous), f"lancedb://{self.table}?table=docs"):
            result = CliRunner().invoke(app, _arguments(folder / "v1", model, out))
            assert result.exit_code == 0, result.output
        self.next = _next_version(records)
        self.held = {r["id"] for r in self.next}
        self.previous_ids = set(pq.read_table(self.previous)["id"].to_pylist())

    def __repr__(self) -> str:
        return f"versions in {self.folder}"

    def corpus(self, damage: str, into: Path) -> Path:
        _write(into, self.next)
        _damage_input(into, damage)
        return into

    @cache  # noqa: B019 (one object for the module)
    def synced(self, damage: str) -> dict:
        """An uninterrupted sync's table (id -> vector)."""
        corpus = self.corpus(damage, self.folder / f"v2-sync-{damage}")
        db = self.folder / f"db-{damage}"
        shutil.copytree(self.table, db)
        uri = f"lancedb://{db}?table=docs"
        result = CliRunner().invoke(app, _arguments(corpus, self.model, uri, uri))
        assert result.exit_code == 0, result.output
        return _vectors(_table(db))

    @cache  # noqa: B019 (one object for the module)
    def expected(self, damage: str) -> tuple[dict, list[str]]:
        """An uninterrupted change set's output (id -> vector) and deletes."""
        corpus = self.corpus(damage, self.folder / f"v2-{damage}")
        out = self.folder / f"out-v2-{damage}"
        arguments = _arguments(corpus, self.model, str(out), str(self.previous))
        result = CliRunner().invoke(app, arguments)
        assert result.exit_code == 0, result.output
        return _vectors(pq.read_table(sorted(out.glob("part-*.parquet")))), _deletes(out)


def _deletes(out: Path) -> list[str]:
    path = out / "_bulkembed" / "changes" / "deletes.parquet"
    return sorted(pq.read_table(path)["id"].to_pylist()) if path.exists() else []


@pytest.fixture(scope="module")
def versions(tiny_st, tmp_path_factory):
    return _Versions(tmp_path_factory.mktemp("versions"), tiny_st("mean"))


_ROUND = st.tuples(
    # SIGKILL after this many units are marked done (input units, then those of kept rows),
    # or once the deletes are written, the output not yet marked complete.
    st.sampled_from(["marked"] * 4 + ["deletes"]),
    st.integers(1, UNITS),
    DAMAGE,
).map(lambda r: (r[0], 1 if r[0] == "deletes" else r[1], r[2]))


def _assert_nothing_held_is_deleted(versions: _Versions, deletes: list[str]) -> None:
    assert not set(deletes) & versions.held, deletes
    assert set(deletes) <= set(GONE)


@pytest.mark.slow
@settings(SEQUENCES, max_examples=50)
@given(
    damage=st.sampled_from(INPUT_DAMAGES),
    rounds=st.lists(_ROUND, min_size=1, max_size=2),
    damage_at_end=DAMAGE,
)
def test_change_sets_over_damaged_inputs_never_delete_what_the_input_holds(
    versions, damage, rounds, damage_at_end
):
    event(f"input: {damage}")
    expected, expected_deletes = versions.expected(damage)
    _assert_nothing_held_is_deleted(versions, expected_deletes)
    # Every previous row the input still holds is in the output, read or not.
    assert versions.previous_ids & versions.held <= expected.keys()
    with tempfile.TemporaryDirectory() as folder:
        corpus = versions.corpus(damage, Path(folder) / "corpus")
        out = Path(folder) / "out"
        arguments = _arguments(corpus, versions.model, str(out), str(versions.previous))

        def check() -> None:
            _assert_nothing_held_is_deleted(versions, _deletes(out))

        if crash_sequence(arguments, out, rounds, damage_at_end, check) is None:
            return
        vectors = _vectors(pq.read_table(sorted(out.glob("part-*.parquet"))))
        assert vectors.keys() == expected.keys()
        for key, vector in expected.items():
            np.testing.assert_allclose(vectors[key], vector, atol=1e-6)
        assert _deletes(out) == expected_deletes
        event("equal to the uninterrupted run")


@pytest.mark.slow
@settings(SEQUENCES, max_examples=10)
@given(
    damage=st.sampled_from(INPUT_DAMAGES),
    kills=st.lists(
        st.tuples(st.sampled_from(["marked", "merged", "deleted"]), st.integers(1, UNITS)),
        min_size=1,
        max_size=2,
    ),
)
def test_table_syncs_over_damaged_inputs_never_delete_what_the_input_holds(versions, damage, kills):
    event(f"input: {damage}")
    with tempfile.TemporaryDirectory() as folder:
        corpus = versions.corpus(damage, Path(folder) / "corpus")
        db = Path(folder) / "db"
        shutil.copytree(versions.table, db)
        uri = f"lancedb://{db}?table=docs"
        arguments = _arguments(corpus, versions.model, uri, uri)
        held = versions.previous_ids & versions.held
        for stage, n in kills:
            command = [sys.executable, str(HARNESS), stage, str(n), "SIGKILL", "--", *arguments]
            killed = subprocess.run(command, capture_output=True, text=True, timeout=300)
            assert killed.returncode in (-9, 0), killed.stderr
            event(f"killed at {stage}" if killed.returncode == -9 else "done before the kill")
            assert held <= set(_table(db)["id"].to_pylist())
        final = CliRunner().invoke(app, arguments)
        assert final.exit_code == 0, final.output
        table, expected = _vectors(_table(db)), versions.synced(damage)
        assert table.keys() == expected.keys()
        for key, vector in expected.items():
            np.testing.assert_allclose(table[key], vector, atol=1e-6)
        # Damage keeps every row of the table that was not read; without it, the two
        # documents deleted from the input are deleted.
        gone = versions.previous_ids - table.keys()
        assert gone == (set() if damage != "none" else set(GONE))
        status = json.loads(CliRunner().invoke(app, ["status", uri, "--json"]).stdout)
        assert status["state"] == "complete"
        event("equal to the uninterrupted run")

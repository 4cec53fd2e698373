"""Random sequences of crashes and damage to the output, then a rerun: the output ends up
exactly the uninterrupted run's, or the rerun refuses in one line naming what it found."""

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from fault_harness import run_forked
from helpers import sample_texts, write_mixed_corpus
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from bulkembed.cli import app

# Units of the corpus: 8 Parquet row groups and 1 JSONL unit.
UNITS = 9


def _corpus(folder: Path) -> Path:
    """72 records in 9 units, with null texts and ids repeated across units."""
    records = [{"id": f"doc-{i}", "text": t} for i, t in enumerate(sample_texts(72))]
    for record in records[2:60:9]:
        record["text"] = None
    for record in records[40:44]:
        record["id"] = f"doc-{int(record['id'][4:]) - 30}"
    return write_mixed_corpus(folder, records, 32, row_group_size=8)


def _arguments(corpus: Path, model: Path, out: Path) -> list[str]:
    return [
        "run", str(corpus), "--model", str(model), "--output", str(out), "--quiet",
        "--dtype", "float32", "--tokenize-workers", "0", "--max-batch-tokens", "256",
    ]  # fmt: skip


def _contents(out: Path) -> tuple[dict, list[str]]:
    """id -> dense vector, and the sorted quarantine lines, of a finished output."""
    table = pq.read_table(sorted(out.glob("part-*.parquet")))
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "an id appears more than once in the output"
    vectors = dict(zip(ids, np.array(table.column("dense").to_pylist()), strict=True))
    quarantine = out / "_bulkembed" / "bad_records.jsonl"
    return vectors, sorted(quarantine.read_text().splitlines())


class _Reference:
    """The corpus and an uninterrupted run's output (shown by name in failure reports)."""

    def __init__(self, corpus: Path, out: Path) -> None:
        self.corpus = corpus
        self.vectors, self.bad = _contents(out)

    def __repr__(self) -> str:
        return f"uninterrupted run of {self.corpus}"


@pytest.fixture(scope="module")
def reference(tiny_st, tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference")
    corpus = _corpus(folder)
    out = folder / "out"
    result = CliRunner().invoke(app, _arguments(corpus, tiny_st("mean"), out))
    assert result.exit_code == 0, result.output
    return _Reference(corpus, out)


def _damage(out: Path, target: int, truncate: bool) -> str:
    """Delete or cut in half one file of the output (a part, a ledger file, anything)."""
    files = sorted(p for p in out.rglob("*") if p.is_file())
    path = files[target % len(files)]
    kind = {out: "a part", out / "_bulkembed" / "done": "a marker"}.get(path.parent, path.name)
    event(f"{'truncated' if truncate else 'deleted'}: {kind}")
    if truncate:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:
        path.unlink()
    return str(path.relative_to(out))


# Damage to the output: which file (an index into its sorted files), and whether it is cut
# in half rather than deleted.
DAMAGE = st.none() | st.tuples(st.integers(0, 1000), st.booleans())
_ROUND = st.tuples(
    st.just("marked"),
    st.integers(1, UNITS - 1),  # SIGKILL after this many units are marked done
    DAMAGE,
)
# Each sequence runs real processes: no deadline, the same examples on every run.
SEQUENCES = settings(
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def crash_sequence(
    arguments: list[str],
    out: Path,
    rounds: list[tuple[str, int, tuple[int, bool] | None]],
    damage_at_end: tuple[int, bool] | None,
    after_each: Callable[[], None] = lambda: None,
) -> Result | None:
    """Runs killed by SIGKILL at the nth pass through a stage (`rounds`: stage, n, then
    damage to a file of `out` or None), `after_each` checked after each, and one more
    damage; then the last run, whose result is returned. A run that refuses must do it in
    one line naming a damaged file: then None."""
    damaged: list[str] = []
    for stage, n, damage in rounds:
        killed = run_forked(stage, n, "SIGKILL", arguments)
        after_each()
        if killed.returncode != -9:
            # Done before the kill (units already done in an earlier round), or refused.
            assert killed.returncode in (0, 1), killed.stderr
            if killed.returncode == 1:
                _assert_one_line_naming(killed.stderr, damaged)
                event("refused")
                return None
        if damage is not None:
            damaged.append(_damage(out, *damage))
    if damage_at_end is not None:
        damaged.append(_damage(out, *damage_at_end))
    final = CliRunner().invoke(app, arguments)
    if final.exit_code == 1:
        _assert_one_line_naming(final.stderr, damaged)
        event("refused")
        return None
    assert final.exit_code == 0, final.output
    return final


@pytest.mark.slow
@settings(SEQUENCES, max_examples=50)
@given(rounds=st.lists(_ROUND, min_size=1, max_size=2), damage_at_end=DAMAGE)
def test_crashes_and_damage_end_in_the_uninterrupted_output_or_a_one_line_refusal(
    reference, tiny_st, rounds, damage_at_end
):
    model = tiny_st("mean")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out"
        arguments = _arguments(reference.corpus, model, out)
        if crash_sequence(arguments, out, rounds, damage_at_end) is None:
            return
        vectors, bad = _contents(out)
        assert vectors.keys() == reference.vectors.keys()
        for key, vector in reference.vectors.items():
            np.testing.assert_allclose(vectors[key], vector, atol=1e-6)
        assert bad == reference.bad
        status = CliRunner().invoke(app, ["status", str(out), "--json"])
        assert json.loads(status.stdout)["state"] == "complete"
        event("equal to the uninterrupted run")


def _assert_one_line_naming(stderr: str, damaged: list[str]) -> None:
    """A refusal is one error line that names a file that was damaged."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert damaged and any(Path(name).name in lines[0] for name in damaged), (lines, damaged)

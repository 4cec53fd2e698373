"""What a run directory records of a run: the fingerprint of its settings, checked on
resume, and the summary of what the output holds."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulkembed.sources.files import content_digest

if TYPE_CHECKING:
    from bulkembed.checkpoint import UnitRecord
    from bulkembed.config import RunConfig
    from bulkembed.model_spec import ModelSpec
    from bulkembed.progress import RunStats
    from bulkembed.sources import Shard


def fingerprint(config: RunConfig, spec: ModelSpec, shards: list[Shard]) -> dict[str, Any]:
    """The settings that decide what the output holds. A run resumes only if they match.

    Inputs count by name, size and modification time (and content, with `--verify-inputs`),
    and a local model by its folder's name and content, so a corpus or a model folder that
    moved still resumes. `--dtype` counts as given: with `auto` a run may resume on another
    kind of device."""
    return {
        # How inputs are cut into units: done markers name units by number.
        "units": f"parquet row groups; {config.records_per_unit} jsonl lines",
        "model": Path(spec.source).name if spec.local else spec.source,
        "model_version": spec.version,
        "family": spec.family,
        "outputs": list(spec.outputs),
        "sparse_top_k": spec.sparse_top_k,
        "dim": config.dim,
        "dtype_out": config.dtype_out.value,
        "quantize": None if config.quantize is None else config.quantize.value,
        "pooling": spec.pooling.value if spec.pooling else None,
        "normalize": spec.normalize,
        "max_length": spec.max_length,
        "prompt": spec.prompt,
        "lowercase": spec.lowercase,
        "dtype": config.dtype.value,
        "text_column": config.text_column,
        "id_column": config.id_column,
        "limit": config.limit,
        "inputs": [_input(s, config.verify_inputs) for s in shards],
        "keep_columns": list(config.keep_columns),
        "since": str(Path(config.since).resolve()) if config.since else None,
    }


def _input(shard: Shard, verify: bool) -> dict[str, Any]:
    """An input as the fingerprint knows it; with `verify`, a digest of its content."""
    found: dict[str, Any] = {"name": shard.name, "size": shard.size, "modified": shard.modified}
    if verify and shard.format != "hf":
        found["content"] = content_digest(shard.path)
    return found


@dataclass(frozen=True, slots=True)
class Changes:
    """Documents against the `--since` output: new, changed, carried over unchanged, and
    deleted (None with `--limit`, since the documents past it are not read)."""

    new: int
    changed: int
    unchanged: int
    deleted: int | None


@dataclass(frozen=True, slots=True)
class Summary:
    """What the output holds, over every run that wrote it (`docs` ... `parts`), this run's
    figures (`docs_this_run` ... `device_idle_fraction`) and settings (`run`: model,
    device, dtype, ...). Written as `summary.json` (`as_dict`)."""

    docs: int
    changes: Changes | None
    tokens: int
    padding_efficiency: float
    bad_records: int
    truncated: int
    units: int
    parts: int
    docs_this_run: int
    batches_this_run: int
    seconds: float
    docs_per_s: float
    tokens_per_s: float
    encode_seconds: float
    device_idle_fraction: float
    run: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """`summary.json`: the figures flat, the `--since` counts after `docs`, then the
        settings."""
        figures = {f: getattr(self, f) for f in self.__dataclass_fields__}
        changes, run = figures.pop("changes"), figures.pop("run")
        docs = {"docs": figures.pop("docs")}
        return {**docs, **({} if changes is None else asdict(changes)), **figures, **run}


def _changes(done: dict[str, UnitRecord], previous_rows: int, limited: bool) -> Changes:
    """New, changed, unchanged and deleted documents against the `--since` output."""
    rows = sum(r.rows for r in done.values())
    carried = sum(r.carried for r in done.values())
    changed = sum(r.changed for r in done.values())
    deleted = None if limited else previous_rows - carried - changed
    return Changes(rows - carried - changed, changed, carried, deleted)


def summarize(
    done: dict[str, UnitRecord],
    stats: RunStats,
    run_info: dict[str, Any],
    previous_rows: int | None = None,
    limited: bool = False,
) -> Summary:
    """The whole output's figures (over every run that wrote it) and this run's speed;
    with `previous_rows` (`--since`), the counts against the previous output."""
    tokens = sum(r.tokens for r in done.values())
    padded = sum(r.padded_tokens for r in done.values())
    return Summary(
        docs=sum(r.rows for r in done.values()),
        changes=None if previous_rows is None else _changes(done, previous_rows, limited),
        tokens=tokens,
        padding_efficiency=round(tokens / padded, 4) if padded else 1.0,
        bad_records=sum(r.bad_records for r in done.values()),
        truncated=sum(r.truncated for r in done.values()),
        units=len(done),
        parts=sum(1 for r in done.values() if r.rows),
        docs_this_run=stats.docs,
        batches_this_run=stats.batches,
        seconds=round(stats.seconds, 3),
        docs_per_s=round(stats.docs_per_s, 2),
        tokens_per_s=round(stats.tokens_per_s, 1),
        encode_seconds=round(stats.encode_seconds, 3),
        device_idle_fraction=round(stats.device_idle_fraction, 3),
        run=run_info,
    )

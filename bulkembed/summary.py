"""The summary of a run: what the output holds, this run's figures and its settings."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from bulkembed.errors import TooManyBadRecords
from bulkembed.wording import counted

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord
    from bulkembed.progress import RunStats


@dataclass(frozen=True, slots=True)
class Changes:
    """Documents against the `--since` output: new, changed, carried over unchanged, and
    deleted (None with `--limit`, since the documents past it are not read); and what was
    embedded (the new and changed documents, their tokens and truncated texts), where the
    summary's `docs`, `tokens` and `truncated` cover the whole output."""

    new: int
    changed: int
    unchanged: int
    deleted: int | None
    docs_embedded: int
    tokens_embedded: int
    truncated_embedded: int


@dataclass(frozen=True, slots=True)
class Summary:
    """What the output holds, over every run that wrote it (`docs` ... `parts`), this run's
    figures (`docs_this_run` ... `stage_seconds`, the busy seconds of each stage) and
    settings (`run`: model, device, dtype, ...). Written as `summary.json` (`as_dict`).

    `seconds` runs from the command's start, `startup_seconds` from there to the first
    batch (None if none ran); the rates and `device_idle_fraction` are over the rest."""

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
    startup_seconds: float | None
    docs_per_s: float
    tokens_per_s: float
    encode_seconds: float
    device_idle_fraction: float
    stage_seconds: dict[str, float]
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
    tokens = sum(r.tokens for r in done.values())
    truncated = sum(r.truncated for r in done.values())
    embedded = rows - carried
    return Changes(embedded - changed, changed, carried, deleted, embedded, tokens, truncated)


def summarize(
    done: dict[str, UnitRecord],
    stats: RunStats,
    run_info: dict[str, Any],
    previous_rows: int | None = None,
    limited: bool = False,
) -> Summary:
    """The whole output's figures (over every run that wrote it, carried-over documents
    included) and this run's speed; with `previous_rows` (`--since`), the counts against
    the previous output and what was embedded."""
    tokens = sum(r.tokens for r in done.values())
    padded = sum(r.padded_tokens for r in done.values())
    startup = stats.startup_seconds
    return Summary(
        docs=sum(r.rows for r in done.values()),
        changes=None if previous_rows is None else _changes(done, previous_rows, limited),
        tokens=tokens + sum(r.carried_tokens for r in done.values()),
        padding_efficiency=round(tokens / padded, 4) if padded else 1.0,
        bad_records=sum(r.bad_records for r in done.values()),
        truncated=sum(r.truncated + r.carried_truncated for r in done.values()),
        units=len(done),
        parts=sum(1 for r in done.values() if r.rows),
        docs_this_run=stats.docs,
        batches_this_run=stats.batches,
        seconds=round(stats.seconds, 3),
        startup_seconds=None if startup is None else round(startup, 3),
        docs_per_s=round(stats.docs_per_s, 2),
        tokens_per_s=round(stats.tokens_per_s, 1),
        encode_seconds=round(stats.encode_seconds, 3),
        device_idle_fraction=round(stats.device_idle_fraction, 3),
        stage_seconds={stage: round(seconds, 3) for stage, seconds in stats.stages.items()},
        run=run_info,
    )


def check_bad_records(summary: Summary, limit: float | None) -> None:
    """Raise `TooManyBadRecords` when the output holds more bad records than `limit`
    allows: a count (25), or a fraction below 1 of the records read (0.01 for 1%)."""
    if limit is None:
        return
    read = summary.docs + summary.bad_records
    allowed = limit * read if 0 < limit < 1 else limit
    if summary.bad_records > allowed:
        what = f"{limit:g} of {read} records read" if 0 < limit < 1 else f"{int(limit)}"
        raise TooManyBadRecords(
            f"{counted(summary.bad_records, 'bad record')}, over --max-bad-records {what}; "
            "the run finished and committed the rest",
            summary,
        )

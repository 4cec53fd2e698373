"""The summary of a run: what the output holds, this run's figures and its settings."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from bulkembed.errors import TooManyBadRecords, TooManyDeletes
from bulkembed.incremental.deletions import (
    MAX_BAD_RECORDS_OPTION,
    MAX_DELETES_OPTION,
    Deletions,
    allowed_deletes,
)
from bulkembed.wording import counted

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord
    from bulkembed.reporting.progress import RunStats


@dataclass(frozen=True, slots=True)
class Changes:
    """Documents against the `--since` output: new, changed, carried over unchanged, and
    deleted (None with `--limit`, since the documents past it are not read); the previous
    rows kept although the input did not hold them, because their record or file could
    not be read (`kept_unread`) or because deleting them was over a limit
    (`deletes_withheld`, `deletes_held_by` naming the limit's option); and what was
    embedded (the new and changed documents, their tokens and truncated texts), where the
    summary's `docs`, `tokens` and `truncated` cover the whole output."""

    new: int
    changed: int
    unchanged: int
    deleted: int | None
    kept_unread: int
    deletes_withheld: int
    deletes_held_by: str | None
    docs_embedded: int
    tokens_embedded: int
    truncated_embedded: int


@dataclass(frozen=True, slots=True)
class PreviousCounts:
    """What an incremental run knows of its previous output: its rows, and what the run
    did with the ids its input no longer holds (None until every unit is done)."""

    rows: int
    deletions: Deletions | None


@dataclass(frozen=True, slots=True)
class Summary:
    """What the output holds, over every run that wrote it (`docs` ... `parts`), this run's
    figures (`docs_this_run` ... `stage_seconds`, the busy seconds of each stage;
    `saved_this_run`, documents an interrupted run embedded and saved, taken by this one;
    `float32_retries_this_run`, batches embedded again in float32) and
    settings (`run`: model, device, dtype, ...). Written as `summary.json` (`as_dict`).

    `seconds` runs from the command's start, `startup_seconds` from there to the first
    batch (None if none ran), `embedding_seconds` from there to the last commit; the rates,
    `device_idle_fraction` (the host's clock: the model waited for input or writing) and
    `device_busy_fraction` (CUDA events: the GPU computed; None on a CPU) are over the
    embedding seconds."""

    docs: int
    changes: Changes | None
    tokens: int
    padding_efficiency: float
    bad_records: int
    truncated: int
    cut: int
    units: int
    parts: int
    docs_this_run: int
    saved_this_run: int
    batches_this_run: int
    float32_retries_this_run: int
    seconds: float
    startup_seconds: float | None
    embedding_seconds: float
    docs_per_s: float
    tokens_per_s: float
    encode_seconds: float
    device_idle_fraction: float
    device_busy_fraction: float | None
    stage_seconds: dict[str, float]
    run: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """`summary.json`: the figures flat, the `--since` counts after `docs`, then the
        settings."""
        figures = {f: getattr(self, f) for f in self.__dataclass_fields__}
        changes, run = figures.pop("changes"), figures.pop("run")
        docs = {"docs": figures.pop("docs")}
        if run.get("modality") == "images":
            # Images are decoded where texts are tokenized: the stage has their name.
            stages = dict(figures["stage_seconds"])
            stages["decode"] = stages.pop("tokenize", 0.0)
            figures["stage_seconds"] = stages
            figures["images_per_s"] = figures["docs_per_s"]
        return {**docs, **({} if changes is None else asdict(changes)), **figures, **run}


def _changes(done: dict[str, UnitRecord], previous: PreviousCounts, limited: bool) -> Changes:
    """New, changed, unchanged and deleted documents against the `--since` output."""
    inputs = [r for r in done.values() if not r.kept]
    rows = sum(r.rows for r in inputs)
    carried = sum(r.carried for r in inputs)
    changed = sum(r.changed for r in inputs)
    deletions = previous.deletions or Deletions(previous.rows - carried - changed, 0)
    tokens = sum(r.tokens for r in inputs)
    truncated = sum(r.truncated for r in inputs)
    embedded = rows - carried
    return Changes(
        new=embedded - changed,
        changed=changed,
        unchanged=carried,
        deleted=None if limited else deletions.deleted,
        kept_unread=deletions.kept,
        deletes_withheld=deletions.withheld,
        deletes_held_by=deletions.held_by,
        docs_embedded=embedded,
        tokens_embedded=tokens,
        truncated_embedded=truncated,
    )


def summarize(
    done: dict[str, UnitRecord],
    stats: RunStats,
    run_info: dict[str, Any],
    previous: PreviousCounts | None = None,
    limited: bool = False,
) -> Summary:
    """The whole output's figures (over every run that wrote it, carried-over and kept
    documents included) and this run's speed; with `previous` (`--since`), the counts
    against the previous output and what was embedded."""
    tokens = sum(r.tokens for r in done.values())
    padded = sum(r.padded_tokens for r in done.values())
    startup = stats.startup_seconds
    busy = stats.device_busy_fraction
    return Summary(
        docs=sum(r.rows for r in done.values()),
        changes=None if previous is None else _changes(done, previous, limited),
        tokens=tokens + sum(r.carried_tokens for r in done.values()),
        padding_efficiency=round(tokens / padded, 4) if padded else 1.0,
        bad_records=sum(r.bad_records for r in done.values()),
        truncated=sum(r.truncated + r.carried_truncated for r in done.values()),
        cut=sum(r.cut for r in done.values()),
        units=len(done),
        parts=sum(1 for r in done.values() if r.rows),
        docs_this_run=stats.docs,
        saved_this_run=stats.saved,
        batches_this_run=stats.batches,
        float32_retries_this_run=stats.counts.float32_retries,
        seconds=round(stats.seconds, 3),
        startup_seconds=None if startup is None else round(startup, 3),
        embedding_seconds=round(stats.embedding_seconds, 3),
        docs_per_s=round(stats.docs_per_s, 2),
        tokens_per_s=round(stats.tokens_per_s, 1),
        encode_seconds=round(stats.encode_seconds, 3),
        device_idle_fraction=round(stats.device_idle_fraction, 3),
        device_busy_fraction=None if busy is None else round(busy, 3),
        stage_seconds={stage: round(seconds, 3) for stage, seconds in stats.stages.items()},
        run=run_info,
    )


def over_bad_record_limit(limit: float | None, bad: int, read: int) -> bool:
    """Whether `bad` bad records among `read` records are more than `--max-bad-records`
    allows: a count (25), or a fraction below 1 of the records read (0.01 for 1%)."""
    if limit is None:
        return False
    return bad > (limit * read if 0 < limit < 1 else limit)


def check_bad_records(summary: Summary, limit: float | None) -> None:
    """Raise `TooManyBadRecords` when the output holds more bad records than `limit`
    allows; an incremental run then deleted nothing, which the message says."""
    changes = summary.changes
    # Rows kept from the previous output were not read.
    kept = 0 if changes is None else changes.kept_unread + changes.deletes_withheld
    read = summary.docs - kept + summary.bad_records
    if not over_bad_record_limit(limit, summary.bad_records, read):
        return
    assert limit is not None
    what = f"{limit:g} of {read} records read" if 0 < limit < 1 else f"{int(limit)}"
    withheld = 0 if changes is None else changes.deletes_withheld
    deletes = ""
    if withheld:
        deletes = f"; nothing was deleted ({counted(withheld, 'id')} gone from the input kept)"
    raise TooManyBadRecords(
        f"{counted(summary.bad_records, 'bad record')}, over {MAX_BAD_RECORDS_OPTION} {what}; "
        f"the run finished and committed the rest{deletes}",
        summary,
    )


def check_deletes(summary: Summary, limit: float | None) -> None:
    """Raise `TooManyDeletes` when an incremental run's deletes are withheld and more than
    `--max-deletes` allows (whichever limit withheld them first)."""
    changes = summary.changes
    if changes is None or not changes.deletes_withheld:
        return
    # Each of the previous output's ids was found again, or was not and is now kept.
    previous = changes.unchanged + changes.changed + changes.kept_unread + changes.deletes_withheld
    if changes.deletes_withheld <= allowed_deletes(limit, previous):
        return
    withheld = Deletions(0, changes.kept_unread, changes.deletes_withheld, MAX_DELETES_OPTION)
    raise TooManyDeletes(withheld.message(previous, limit), summary)

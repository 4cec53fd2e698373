"""`bulkembed report OUT`: one self-contained HTML page about a run, from what its run
directory already holds; no figure is measured again.

- tokens per second over time: the tokens of the units committed in each interval, from
  the times of their done-markers (all devices together: a marker does not say which
  device embedded its unit);
- the documents' lengths in tokens: each row's count from the labels of the Parquet parts
  (elsewhere, each unit's mean length for its rows);
- padding efficiency of each unit, in the order units were committed;
- the busy seconds of each stage, and the device's busy and idle share (`summary.json`);
- bad records by reason (`bad_records.jsonl`);
- the encoder record and the run's figures, as tables.

The page holds its charts as inline SVG (`bulkembed.reporting.charts`): no script, nothing
fetched. It is written to `_bulkembed/report.html` in the run directory unless a path is
given; a file there that bulkembed did not write is refused.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from bulkembed.contracts import RowCounts
from bulkembed.errors import OutputError, UsageError
from bulkembed.reporting import charts
from bulkembed.run_dir import RunDirectory
from bulkembed.sinks import OutputTarget

# The first line of every report: how a report is told from a file bulkembed did not write.
MARK = "<!DOCTYPE html>\n<!-- bulkembed report -->"
# Points of the tokens-per-second line at most.
_INTERVALS = 30


@dataclass
class RunRecord:
    """What a run directory holds that the report shows."""

    label: str
    summary: dict[str, Any]
    encoder: dict[str, Any]
    # (commit time in seconds since the first, tokens, padded tokens, rows) of each unit.
    units: list[tuple[float, int, int, int]] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)


def read_run(target: OutputTarget) -> RunRecord:
    """The record of the run that wrote `target`; a one-line error where there is none."""
    run = RunDirectory.for_target(target, None)
    if not run.config_path.exists():
        raise UsageError(f"{target.label} holds no bulkembed run: nothing to report")
    config = run.read_config()
    summary = json.loads(run.summary_path.read_text()) if run.summary_path.exists() else {}
    record = RunRecord(target.label, summary, config.get("encoder") or {})
    done = run.done_units()
    times = {part: run.ledger.path(part).stat().st_mtime_ns / 1e9 for part in done}
    first = min(times.values(), default=0.0)
    for part in sorted(done, key=times.__getitem__):
        unit = done[part]
        record.units.append((times[part] - first, unit.tokens, unit.padded_tokens, unit.rows))
    record.lengths = _lengths(target, done)
    if run.bad_records_path.exists():
        for line in run.bad_records_path.read_text(encoding="utf-8").splitlines():
            try:
                record.reasons[str(json.loads(line).get("reason", "?"))] += 1
            except (ValueError, AttributeError):
                continue
    return record


def _lengths(target: OutputTarget, done: dict[str, Any]) -> list[int]:
    """Each embedded row's tokens: from the labels of the Parquet parts, where the output
    has them; else each unit's mean, for each of its rows."""
    import pyarrow.parquet as pq

    from bulkembed.sinks.part_files import part_label, part_path

    lengths: list[int] = []
    for part, unit in done.items():
        counts = None
        if target.kind == "parquet" and isinstance(target.path, Path):
            path = part_path(target.path, part)
            label = part_label(pq.read_metadata(path)) if path.is_file() else None
            if label is not None:
                counts = RowCounts.decode(label.get("counts"), label["rows"])
        if counts is not None:
            lengths += [int(t) for t in counts.tokens if t >= 0]
        elif unit.rows and unit.tokens:
            lengths += [round(unit.tokens / max(1, unit.rows - unit.carried))] * unit.rows
    return lengths


def _tokens_per_second(
    units: list[tuple[float, int, int, int]],
) -> tuple[str, list[tuple[float, float]]]:
    """The time unit (`seconds` for a run under 2 minutes, else `minutes`) and (time since
    the first commit, tokens/s) over equal intervals of the run."""
    if len(units) < 2:
        return "seconds", []
    end = units[-1][0]
    scale, unit = (1.0, "seconds") if end < 120 else (60.0, "minutes")
    step = max(end / _INTERVALS, 1e-3)
    totals: dict[int, int] = {}
    for seconds, tokens, _, _ in units[1:]:
        slot = min(_INTERVALS - 1, int(seconds / step))
        totals[slot] = totals.get(slot, 0) + tokens
    return unit, [((i + 1) * step / scale, totals.get(i, 0) / step) for i in range(_INTERVALS)]


def render(record: RunRecord) -> str:
    """The report page of `record`."""
    summary = record.summary
    stages = [(s, float(v)) for s, v in (summary.get("stage_seconds") or {}).items()]
    idle = float(summary.get("device_idle_fraction") or 0.0)
    padding = [
        (float(number), tokens / padded)
        for number, (_, tokens, padded, _) in enumerate(record.units)
        if padded
    ]
    unit, rates = _tokens_per_second(record.units)
    reasons = record.reasons.most_common(12)
    sections = [
        (
            "Tokens per second over time",
            charts.line_chart(
                "tokens per second over time",
                f"{unit} since the first unit committed",
                "tokens/s",
                rates,
            ),
        ),
        (
            "Document lengths",
            charts.histogram("document lengths in tokens", "tokens", record.lengths),
        ),
        (
            "Padding efficiency by unit",
            charts.line_chart("padding efficiency by unit", "unit", "efficiency", padding),
        ),
        ("Stage seconds", charts.bar_chart("busy seconds of each stage", stages, "s")),
        (
            "Device busy and idle",
            charts.bar_chart(
                "share of the embedding time",
                [("busy", 100 * (1 - idle)), ("idle", 100 * idle)],
                "%",
            ),
        ),
    ]
    if reasons:
        bad = charts.bar_chart("bad records by reason", reasons, "records")
        sections.append(("Bad records by reason", bad))
    else:
        sections.append(("Bad records by reason", "<p>none</p>"))
    figures = {k: v for k, v in summary.items() if not isinstance(v, dict | list)}
    body = [f"<h1>bulkembed run: {escape(record.label)}</h1>"]
    for title, chart in sections:
        body.append(f"<section><h2>{escape(title)}</h2>{chart}</section>")
    body.append(f"<section><h2>Figures</h2>{_table(figures)}</section>")
    body.append(f"<section><h2>Encoder</h2>{_table(record.encoder)}</section>")
    style = (
        "body{font-family:sans-serif;max-width:720px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse}td{border:1px solid #ccc;padding:2px 8px}"
    )
    return (
        f'{MARK}\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>bulkembed run: {escape(record.label)}</title><style>{style}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def _table(values: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td>{escape(str(k))}</td><td>{escape(str(v))}</td></tr>" for k, v in values.items()
    )
    return f"<table>{rows}</table>"


def write_report(target: OutputTarget, path: Path | None) -> Path:
    """Write the report of `target`'s run to `path` (default: `report.html` in its run
    directory, on a local disk); where it went."""
    record = read_run(target)
    if path is None:
        run = RunDirectory.for_target(target, None)
        if not isinstance(run.meta, Path):
            raise UsageError(f"{target.label} is on object storage: name a local file, --to PATH")
        path = run.meta / "report.html"
    if path.exists() and not path.read_text(errors="replace").startswith(MARK):
        raise OutputError(f"{path} exists and is not a bulkembed report: choose another --to")
    try:
        path.write_text(render(record), encoding="utf-8")
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from e
    return path

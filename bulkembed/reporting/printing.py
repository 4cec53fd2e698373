"""What bulkembed prints once a run ends, or for `bulkembed status`: the closing summary in a
few lines, the full figures as a table, and one-line errors, all outside the progress
display (`bulkembed.reporting.progress`)."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from bulkembed.reporting.rates import duration
from bulkembed.wording import counted

# The closing summary's width: it fits a terminal of 80 columns.
SUMMARY_WIDTH = 80


def _fit(line: str, width: int = SUMMARY_WIDTH) -> str:
    """`line`, its middle cut out if it is wider than `width`."""
    if len(line) <= width:
        return line
    keep = width - 1
    return line[: keep // 2] + "…" + line[len(line) - (keep - keep // 2) :]


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The end of a run in at most 10 lines: what the output holds, this run's speed (and,
    when it ran batches, their padding and the device's idle time), the model, changes
    against `--since` (and the rows it did not delete), bad and truncated records, and
    where the full figures are (`summary.json`, `bulkembed status`). Lines are cut in the
    middle to 80 columns, but for the two that name the output: it is kept whole, to be
    pasted into the next command."""
    output = summary.get("output") or "stdout"
    seconds = summary.get("seconds") or 0.0
    batches = summary.get("batches_this_run", 0)
    things = "images" if summary.get("modality") == "images" else "docs"
    lines = [
        f"this run: {summary.get('docs_this_run', 0):,} {things} embedded in "
        f"{duration(seconds)}: {summary.get('docs_per_s', 0):,.0f} {things}/s, "
        f"{summary.get('tokens_per_s', 0):,.0f} tok/s",
        *(
            [
                f"padding efficiency {summary.get('padding_efficiency', 1.0):.2f}, device idle "
                f"{100 * (summary.get('device_idle_fraction') or 0):.0f}%, "
                f"{counted(batches, 'batch', 'batches')}"
            ]
            if batches
            else []
        ),
        f"model {summary.get('model')} on {summary.get('device')} ({summary.get('dtype')}"
        f"{', ' + summary['backend'] if summary.get('backend') else ''}"
        f"{', flat' if summary.get('attention') == 'flat' else ''}): "
        f"{summary.get('outputs')}",
    ]
    if summary.get("saved_this_run"):
        lines.append(
            f"{counted(summary['saved_this_run'], things[:-1])} embedded before an interrupt "
            "taken as saved"
        )
    if summary.get("new") is not None:
        lines += _since_lines(summary)
    if summary.get("bad_records"):
        lines.append(
            f"{counted(summary['bad_records'], 'bad record')} set aside (bad_records.jsonl)"
        )
    if summary.get("truncated"):
        lines.append(
            f"{counted(summary['truncated'], 'doc')} cut at {summary.get('max_length')} tokens "
            "(--max-length)"
        )
    if summary.get("cut"):
        lines.append(
            f"{counted(summary['cut'], 'doc')} so long that only the start of its text was "
            "tokenized (the tokens it kept are the whole text's)"
        )
    whole = [f"done: {summary.get('docs', 0):,} docs in {output}"]
    closing = [f"full figures: bulkembed status {output} (and its summary.json)"]
    return whole + [_fit(line) for line in lines] + (closing if output != "stdout" else [])


def _since_lines(summary: dict[str, Any]) -> list[str]:
    """New, changed, unchanged and deleted documents; and, on a line of their own, the
    previous rows the run did not delete although its input lacks them."""
    deleted = summary.get("deleted")
    lines = [
        f"since the previous output: {summary['new']:,} new, {summary['changed']:,} changed, "
        f"{summary['unchanged']:,} unchanged, "
        + ("deleted unknown (--limit)" if deleted is None else f"{deleted:,} deleted")
    ]
    withheld = summary.get("deletes_withheld") or 0
    kept = summary.get("kept_unread") or 0
    held = [f"{withheld:,} gone ({summary.get('deletes_held_by')})"] if withheld else []
    held += [f"{kept:,} not read (bad_records.jsonl)"] if kept else []
    if held:
        lines.append(f"not deleted: {', '.join(held)}")
    return lines


def summary_table(summary: dict[str, Any], title: str = "bulkembed summary") -> Table:
    """Figures of a run as a two-column table."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("figure", style="bold")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if value is None:
            text = "-"
        elif isinstance(value, bool):
            text = str(value).lower()
        elif isinstance(value, float):
            text = f"{value:,.3f}" if value < 100 else f"{value:,.0f}"
        elif isinstance(value, int):
            text = f"{value:,}"
        elif isinstance(value, dict):
            text = ", ".join(f"{name} {figure}" for name, figure in value.items())
        else:
            text = str(value)
        table.add_row(key.replace("_", " "), text)
    return table


def print_status(status: dict[str, Any]) -> None:
    """`bulkembed status`: the state of a run directory, on stdout; its message below the
    figures."""
    figures = {key: value for key, value in status.items() if key != "message"}
    console = Console(highlight=False)
    console.print(summary_table(figures, title="bulkembed status"))
    console.print(status.get("message", ""), soft_wrap=True, markup=False)


def print_error(message: str) -> None:
    """One line on stderr, never wrapped."""
    flat = " ".join(message.splitlines())
    sys.stderr.write(f"error: {flat}\n")
    sys.stderr.flush()

"""Everything bulkembed prints: progress while it runs, a summary at the end, errors.

All of it goes to stderr, so stdout stays free for data. On a terminal progress is a rich
bar; otherwise (CI logs, files) it is a plain line every few seconds.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

Item = TypeVar("Item")
LOG_INTERVAL_SECONDS = 10.0
# The stages of a run whose busy seconds `RunStats.stages` adds up, in pipeline order.
STAGES = ("read", "tokenize", "pack", "model", "post-process", "write")


@dataclass(slots=True)
class RunStats:
    """Counters of a run, updated after every batch. `docs` went through the model;
    `carried` were copied from a previous output (`--since`); `encode_seconds` is the time
    the model was busy (batches in, vectors back on the host). `stages` holds the busy
    seconds of each of `STAGES` (tokenize summed over the tokenizer processes): where a
    run's time goes, for the benchmarks and `summary.json`."""

    docs: int = 0
    carried: int = 0
    encode_seconds: float = 0.0
    tokens: int = 0
    padded_tokens: int = 0
    batches: int = 0
    started: float = field(default_factory=time.monotonic)
    stages: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    @contextlib.contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Add the time spent in the `with` block to `stage`'s busy seconds."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.stages[stage] += time.perf_counter() - started

    def timed_iterator(self, stage: str, items: Iterator[Item]) -> Iterator[Item]:
        """`items`, adding the time spent producing each to `stage`'s busy seconds."""
        while True:
            started = time.perf_counter()
            try:
                item = next(items)
            except StopIteration:
                return
            finally:
                self.stages[stage] += time.perf_counter() - started
            yield item

    def add(self, other: RunStats, share: float = 1.0) -> None:
        """Count in what `other` counted (another process's part of the run), its seconds
        times `share`: with N devices side by side, 1/N makes the seconds the mean device's."""
        self.docs += other.docs
        self.carried += other.carried
        self.encode_seconds += other.encode_seconds * share
        self.tokens += other.tokens
        self.padded_tokens += other.padded_tokens
        self.batches += other.batches
        for stage, seconds in other.stages.items():
            self.stages[stage] += seconds * share

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    @property
    def docs_per_s(self) -> float:
        return self.docs / max(self.seconds, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def device_idle_fraction(self) -> float:
        """The share of the run's time the model waited for input or for writing."""
        return max(0.0, 1.0 - self.encode_seconds / max(self.seconds, 1e-9))

    @property
    def padding_efficiency(self) -> float:
        return self.tokens / self.padded_tokens if self.padded_tokens else 1.0


def _rates(stats: RunStats) -> str:
    return (
        f"{stats.docs_per_s:,.0f} docs/s  {stats.tokens_per_s:,.0f} tok/s  "
        f"padding eff {stats.padding_efficiency:.2f}"
    )


class Reporter(Protocol):
    """What a run tells its user, as it goes."""

    def info(self, message: str) -> None:
        """A line about the run before it starts (model, device, derived figures)."""

    def warn(self, message: str) -> None:
        """Something the user should know even with `--quiet` (a mended ledger)."""

    def start(self, stats: RunStats) -> None:
        """The run begins; the total may come later, by `set_total`."""

    def set_total(self, total: int) -> None:
        """Documents to embed, once counted."""

    def update(self, stats: RunStats) -> None:
        """Counters moved."""

    def finish(self, summary: dict[str, Any]) -> None:
        """The run ended; `summary` is what `summary.json` holds."""

    def close(self) -> None:
        """Release the terminal, whatever happened."""


class QuietReporter:
    """Prints nothing but warnings (`--quiet`, the Python API, Ray actors); the other
    reporters add to it."""

    def __init__(self) -> None:
        self.console = Console(stderr=True, highlight=False)

    def info(self, message: str) -> None:
        """A line about the run before it starts (model, device, derived figures)."""

    def warn(self, message: str) -> None:
        """Something the user should know even with `--quiet` (a mended ledger)."""
        self.console.print(f"warning: {message}", soft_wrap=True, markup=False)

    def start(self, stats: RunStats) -> None:
        """The run begins; the total may come later, by `set_total`."""

    def set_total(self, total: int) -> None:
        """Documents to embed, once counted."""

    def update(self, stats: RunStats) -> None:
        """Counters moved."""

    def finish(self, summary: dict[str, Any]) -> None:
        """The run ended; `summary` is what `summary.json` holds."""

    def close(self) -> None:
        """Release the terminal, whatever happened."""


class LogReporter(QuietReporter):
    """A plain line every `interval` seconds, for logs."""

    def __init__(self, interval: float = LOG_INTERVAL_SECONDS) -> None:
        super().__init__()
        self.interval = interval
        self._last = 0.0
        self._total: int | None = None

    def info(self, message: str) -> None:
        self.console.print(message, soft_wrap=True, markup=False)

    def set_total(self, total: int) -> None:
        self._total = total

    def update(self, stats: RunStats) -> None:
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        self._last = now
        done = f"{stats.docs + stats.carried:,}" + (f"/{self._total:,}" if self._total else "")
        self.console.print(f"bulkembed: {done} docs  {_rates(stats)}", soft_wrap=True)

    def finish(self, summary: dict[str, Any]) -> None:
        self.console.print(summary_table(summary))


class BarReporter(LogReporter):
    """A rich progress bar on the terminal."""

    def __init__(self) -> None:
        super().__init__()
        self.progress = Progress(
            TextColumn("embedding"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rates]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task("embed", total=None, rates="", start=False)

    def start(self, stats: RunStats) -> None:
        self.progress.start()
        self.progress.start_task(self.task)

    def set_total(self, total: int) -> None:
        self.progress.update(self.task, total=total)

    def update(self, stats: RunStats) -> None:
        completed = stats.docs + stats.carried
        self.progress.update(self.task, completed=completed, rates=_rates(stats))

    def finish(self, summary: dict[str, Any]) -> None:
        self.close()
        super().finish(summary)

    def close(self) -> None:
        self.progress.stop()


def make_reporter(quiet: bool) -> Reporter:
    """The reporter for this terminal: silent, a progress bar, or log lines."""
    if quiet:
        return QuietReporter()
    return BarReporter() if sys.stderr.isatty() else LogReporter()


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

"""Everything bulkembed prints: progress while it runs, a summary at the end, errors.

All of it goes to stderr, so stdout stays free for data. On a terminal progress is a rich
bar; otherwise (CI logs, files) it is a timestamped line every few seconds. Both name the
phase a run is in before its first batch and after its last (loading the model, building an
index), show rates over the last half minute, and the ETA once the total is known.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.text import Text

from bulkembed.contracts import DeviceCounts
from bulkembed.reporting.printing import summary_lines
from bulkembed.reporting.rates import RunProgress, duration

Item = TypeVar("Item")
LOG_INTERVAL_SECONDS = 10.0
# The stages of a run whose busy seconds `RunStats.stages` adds up, in pipeline order.
STAGES = ("read", "tokenize", "pack", "model", "post-process", "write")


@dataclass(slots=True)
class RunStats:
    """Counters of a run, updated after every batch. `docs` went through the model;
    `carried` were copied from a previous output (`--since`); `saved` were embedded by an
    earlier run of the command, which an interrupt stopped (`bulkembed.engine.saved`);
    `read` were tokenized (or
    carried over) by this process so far, ahead of the model, and `read_tokens` are the
    tokens of those of them to embed (for the ETA); `encode_seconds` is the time
    the model was busy (batches in, vectors back on the host); `counts` what the devices
    counted (batches embedded again in float32, busy seconds of the mean device). `stages`
    holds the busy seconds of each of `STAGES` (tokenize summed over the tokenizer
    processes): where a run's time goes, for the benchmarks and `summary.json`.

    Times are on the monotonic clock: `started` when the command started, `embedding`
    when its first batch went to the model (None before), `ended` when the last window's
    vectors were committed (None before). The time from `started` to `embedding` is the
    start-up (imports, listing the inputs, loading the model, the `--dtype auto` check);
    the rates and the device's idle share are over the embedding time, from `embedding`
    to `ended` (to now while it runs): closing the device processes and the output after
    the last commit is not embedding."""

    docs: int = 0
    carried: int = 0
    saved: int = 0
    read: int = 0
    read_tokens: int = 0
    encode_seconds: float = 0.0
    tokens: int = 0
    padded_tokens: int = 0
    batches: int = 0
    counts: DeviceCounts = field(default_factory=DeviceCounts)
    started: float = field(default_factory=time.monotonic)
    embedding: float | None = None
    ended: float | None = None
    stages: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    def begin_embedding(self) -> None:
        """The first batch goes to the model now, unless one went before."""
        if self.embedding is None:
            self.embedding = time.monotonic()

    def end_embedding(self) -> None:
        """The last window's vectors are committed now: the embedding time ends here."""
        if self.embedding is not None and self.ended is None:
            self.ended = time.monotonic()

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
        self.saved += other.saved
        self.encode_seconds += other.encode_seconds * share
        self.tokens += other.tokens
        self.padded_tokens += other.padded_tokens
        self.batches += other.batches
        self.counts.add(other.counts, share)
        for stage, seconds in other.stages.items():
            self.stages[stage] += seconds * share

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    @property
    def startup_seconds(self) -> float | None:
        return None if self.embedding is None else self.embedding - self.started

    @property
    def embedding_seconds(self) -> float:
        if self.embedding is None:
            return 0.0
        return (time.monotonic() if self.ended is None else self.ended) - self.embedding

    @property
    def docs_per_s(self) -> float:
        return self.docs / max(self.embedding_seconds, 1e-9) if self.embedding else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.embedding_seconds, 1e-9) if self.embedding else 0.0

    @property
    def device_idle_fraction(self) -> float:
        """The share of the time since the first batch that the model waited for input or
        for writing."""
        return max(0.0, 1.0 - self.encode_seconds / max(self.embedding_seconds, 1e-9))

    @property
    def device_busy_fraction(self) -> float | None:
        """The share of the time since the first batch that the (mean) GPU computed
        batches, from CUDA events; None where none timed it (a CPU)."""
        busy = self.counts.busy_seconds
        if not busy or self.embedding is None:
            return None
        return min(1.0, busy / max(self.embedding_seconds, 1e-9))

    @property
    def padding_efficiency(self) -> float:
        return self.tokens / self.padded_tokens if self.padded_tokens else 1.0


class Reporter(Protocol):
    """What a run tells its user, as it goes."""

    def info(self, message: str) -> None:
        """A line about the run before it starts (model, device, derived figures)."""

    def warn(self, message: str) -> None:
        """Something the user should know even with `--quiet` (a mended ledger)."""

    def phase(self, label: str) -> None:
        """The run is busy with `label` (loading the model, building an index) until the
        next phase or the first batch."""

    def start(self, stats: RunStats) -> None:
        """Embedding begins; the total may come later, by `set_total`."""

    def set_total(self, total: int) -> None:
        """Documents to embed, once counted."""

    def update(self, stats: RunStats) -> None:
        """Counters moved."""

    def finish(self, summary: dict[str, Any]) -> None:
        """The run ended; `summary` is what `summary.json` holds."""

    def close(self) -> None:
        """Release the terminal, whatever happened; a later `phase` takes it again."""


class QuietReporter:
    """Prints nothing but warnings (`--quiet`, the Python API, Ray actors); the other
    reporters add to it."""

    def __init__(self) -> None:
        self.console = Console(stderr=True, highlight=False)
        self._float32_told = False

    def info(self, message: str) -> None:
        """A line about the run before it starts (model, device, derived figures)."""

    def warn(self, message: str) -> None:
        """Something the user should know even with `--quiet` (a mended ledger)."""
        self.console.print(f"warning: {message}", soft_wrap=True, markup=False)

    def phase(self, label: str) -> None:
        """The run is busy with `label` until the next phase or the first batch."""

    def start(self, stats: RunStats) -> None:
        """Embedding begins; the total may come later, by `set_total`."""

    def set_total(self, total: int) -> None:
        """Documents to embed, once counted."""

    def update(self, stats: RunStats) -> None:
        """Counters moved: the first batch embedded again in float32 is worth a warning."""
        if stats.counts.float32_retries and not self._float32_told:
            self._float32_told = True
            self.warn(
                "a batch gave values that are not finite (NaN or infinity) in half precision: "
                "embedded again in float32, as any such batch is (counted in summary.json, "
                "float32_retries_this_run); --dtype float32 runs every batch in float32"
            )

    def finish(self, summary: dict[str, Any]) -> None:
        """The run ended; `summary` is what `summary.json` holds."""

    def close(self) -> None:
        """Release the terminal, whatever happened."""


class LogReporter(QuietReporter):
    """For logs (CI, files): a timestamped line when a phase begins, then one every
    `interval` seconds, from a thread, so that the lines come steadily however long a batch
    or an index build takes:

        2026-11-25T10:41:07Z  42%  4,200/10,000 docs  1,310 docs/s  402,118 tok/s  ETA 4s
    """

    def __init__(
        self,
        interval: float = LOG_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.interval = interval
        self.wall = wall
        self.progress = RunProgress(clock)
        self._stop: threading.Event | None = None

    def line(self) -> str:
        """The progress line for now, timestamp first."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.wall()))
        return f"{stamp}  {self.progress.describe()}"

    def tick(self) -> None:
        """Print the progress line."""
        self.console.print(self.line(), soft_wrap=True, markup=False)

    def info(self, message: str) -> None:
        self.console.print(message, soft_wrap=True, markup=False)

    def phase(self, label: str) -> None:
        self.progress.begin(label)
        self.tick()
        self._keep_ticking()

    def start(self, stats: RunStats) -> None:
        self.progress.begin(None)
        self._keep_ticking()

    def set_total(self, total: int) -> None:
        self.progress.total = total

    def update(self, stats: RunStats) -> None:
        super().update(stats)
        self.progress.count(stats.docs + stats.carried + stats.saved, stats.tokens)
        self.progress.mean = (stats.docs_per_s, stats.tokens_per_s)
        self.progress.carried = stats.carried + stats.saved
        self.progress.read(stats.read, stats.read_tokens)

    def finish(self, summary: dict[str, Any]) -> None:
        # The last line gives the rates the summary gives, to the end of the embedding.
        self.progress.mean = (summary.get("docs_per_s", 0.0), summary.get("tokens_per_s", 0.0))
        self.close()
        for line in summary_lines(summary):
            self.console.print(line, soft_wrap=True, markup=False)

    def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
            if self.progress.phase is None and self.progress.done:
                self.tick()  # where embedding ended

    def _keep_ticking(self) -> None:
        """Print the line every `interval` seconds until `close`."""
        if self._stop is not None:
            return
        stop = self._stop = threading.Event()

        def ticks() -> None:
            while not stop.wait(self.interval):
                self.tick()

        threading.Thread(target=ticks, name="bulkembed-progress", daemon=True).start()


class _Since(ProgressColumn):
    """Time in the current phase (or embedding), from the task's `since` field."""

    def __init__(self, progress: RunProgress) -> None:
        super().__init__()
        self.progress = progress

    def render(self, task: Task) -> Text:
        return Text(duration(self.progress.clock() - self.progress.since), style="cyan")


class BarReporter(LogReporter):
    """A rich progress bar on the terminal: the phase or `embedding`, the bar (moving to and
    fro while the total is unknown), the percentage done, counts, recent rates, time in the
    phase, ETA."""

    def __init__(self) -> None:
        super().__init__()
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def tick(self) -> None:
        """Nothing to print: the bar redraws itself."""

    def phase(self, label: str) -> None:
        self.progress.begin(label)
        self._show()

    def start(self, stats: RunStats) -> None:
        self.progress.begin(None)
        self._show()

    def set_total(self, total: int) -> None:
        self.progress.total = total
        self._show()

    def update(self, stats: RunStats) -> None:
        super().update(stats)
        self._show()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _show(self) -> None:
        """Draw the current state, starting the bar if it is not shown."""
        if self._bar is None:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(bar_width=24),
                TextColumn("{task.fields[percent]}"),
                TextColumn("{task.fields[counts]}"),
                TextColumn("{task.fields[rates]}"),
                _Since(self.progress),
                TextColumn("{task.fields[eta]}"),
                console=self.console,
            )
            self._task = self._bar.add_task("", total=None, percent="", counts="", rates="", eta="")
            self._bar.start()
        assert self._task is not None
        state = self.progress
        embedding = state.phase is None
        eta = state.eta if embedding else None
        self._bar.update(
            self._task,
            description=state.phase or "embedding",
            completed=state.done if embedding else 0,
            total=state.total if embedding else None,
            percent="" if state.percent is None or not embedding else f"{state.percent}%",
            counts=state.counts() if embedding else "",
            rates=state.rates() if embedding else "",
            eta="" if eta is None else f"ETA {duration(eta)}",
        )


def make_reporter(quiet: bool) -> Reporter:
    """The reporter for this terminal: silent, a progress bar, or log lines."""
    if quiet:
        return QuietReporter()
    return BarReporter() if sys.stderr.isatty() else LogReporter()

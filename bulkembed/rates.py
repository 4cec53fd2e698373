"""Where a run stands, apart from how it is shown: the phase it is in, documents done of
how many, rates over a recent window, and the ETA. `bulkembed.progress` shows it."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

# Rates are measured over the counts of the last this many seconds.
RATE_WINDOW_SECONDS = 30.0


def duration(seconds: float) -> str:
    """`4s`, `1m05s`, `2h03m`: a span short enough for a progress line."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole // 60 % 60:02d}m"


class RateWindow:
    """Documents and tokens per second over the last `span` seconds of counts.

    Counts are added after each batch; the rate is the change between the oldest count in
    the window and the newest over the time between them. The first count comes after the
    first batch, so the start-up (listing inputs, loading the model, checking the dtype)
    never lowers it, and a run that slows down shows it within `span` seconds."""

    def __init__(self, span: float = RATE_WINDOW_SECONDS) -> None:
        self.span = span
        self._counts: deque[tuple[float, int, int]] = deque()

    def add(self, now: float, docs: int, tokens: int) -> None:
        """Counts at time `now` (monotonic seconds)."""
        self._counts.append((now, docs, tokens))
        # Keep one count at or before the window's start, so that the window stays whole.
        while len(self._counts) > 2 and now - self._counts[1][0] >= self.span:
            self._counts.popleft()

    def rates(self) -> tuple[float, float] | None:
        """(docs/s, tokens/s) over the window; None before two counts apart in time."""
        if len(self._counts) < 2:
            return None
        (start, docs, tokens), (end, last_docs, last_tokens) = self._counts[0], self._counts[-1]
        if end <= start:
            return None
        return (last_docs - docs) / (end - start), (last_tokens - tokens) / (end - start)


class RunProgress:
    """Where a run stands, for whichever way it is shown: the phase it is in (a label and
    since when) or, without one, how many documents are done, of how many, how fast over
    the last `RATE_WINDOW_SECONDS`, and when the rest should be done."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.phase: str | None = None
        self.since = clock()
        self.total: int | None = None
        self.done = 0
        self.window = RateWindow()

    def begin(self, label: str | None) -> None:
        """Enter the phase `label` (None: embedding, shown by counts)."""
        self.phase = label
        self.since = self.clock()

    def count(self, done: int, tokens: int) -> None:
        """A batch came back: `done` documents (embedded or carried over) and `tokens`
        embedded so far. The run is embedding."""
        if self.phase is not None:
            self.begin(None)
        self.done = done
        self.window.add(self.clock(), done, tokens)

    @property
    def percent(self) -> int | None:
        """Whole percent done (99 until every document is), when the total is known."""
        if not self.total:
            return None
        return min(100, 100 * self.done // self.total)

    @property
    def eta(self) -> float | None:
        """Seconds until every document is done at the recent rate, when the total is known."""
        rates = self.window.rates()
        if self.total is None or self.done >= self.total or rates is None or rates[0] <= 0:
            return None
        return max(0, self.total - self.done) / rates[0]

    def counts(self) -> str:
        """`4,200/10,000 docs`, or `4,200 docs` while the total is unknown."""
        return f"{self.done:,}" + (f"/{self.total:,}" if self.total else "") + " docs"

    def rates(self) -> str:
        """`1,310 docs/s  402,118 tok/s` over the recent window, or "" before it has one."""
        rates = self.window.rates()
        return "" if rates is None else f"{rates[0]:,.0f} docs/s  {rates[1]:,.0f} tok/s"

    def describe(self) -> str:
        """The state as a line: `loading the model` as it begins, `loading the model (12s)`
        later, or
        `42%  4,200/10,000 docs  1,310 docs/s  402,118 tok/s  ETA 4s`."""
        if self.phase is not None:
            elapsed = self.clock() - self.since
            return self.phase if elapsed < 1 else f"{self.phase} ({duration(elapsed)})"
        fields = [] if self.percent is None else [f"{self.percent}%"]
        fields += [self.counts(), self.rates()]
        if self.eta is not None:
            fields.append(f"ETA {duration(self.eta)}")
        return "  ".join(f for f in fields if f)

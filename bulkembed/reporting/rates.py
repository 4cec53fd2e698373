"""Where a run stands, apart from how it is shown: the phase it is in, documents done of
how many, the run's rates, and the ETA (at the rate over a recent window).
`bulkembed.reporting.progress` shows it."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

# Rates are measured over the counts of the last this many seconds.
RATE_WINDOW_SECONDS = 30.0
# The ETA's rate is over the last this share of the time since the first batch (up to
# `RATE_WINDOW_SECONDS`): the batches to come are more like the last ones than the first.
ETA_SHARE = 1 / 3


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

    def rates(self, since: float | None = None) -> tuple[float, float] | None:
        """(docs/s, tokens/s) over the window, or from the last count at or before `since`
        on; None before two counts apart in time."""
        if len(self._counts) < 2:
            return None
        first = self._counts[0]
        if since is not None:
            first = next((c for c in reversed(self._counts) if c[0] <= since), first)
        (start, docs, tokens), (end, last_docs, last_tokens) = first, self._counts[-1]
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
        self.tokens = 0
        self.read_docs = 0
        self.read_tokens = 0
        self.window = RateWindow()
        # The run's own rates (`RunStats.docs_per_s`, `tokens_per_s`: what the model
        # embedded over the embedding seconds), shown as the summary shows them; and the
        # documents done that were carried over or saved, not embedded.
        self.mean: tuple[float, float] | None = None
        self.carried = 0
        # When the first and the latest batch came back.
        self.first_count: float | None = None
        self.last_count = 0.0

    def begin(self, label: str | None) -> None:
        """Enter the phase `label` (None: embedding, shown by counts)."""
        self.phase = label
        self.since = self.clock()

    def count(self, done: int, tokens: int) -> None:
        """A batch came back: `done` documents (embedded or carried over) and `tokens`
        embedded so far. The run is embedding."""
        if self.phase is not None:
            self.begin(None)
        self.done, self.tokens = done, tokens
        self.last_count = self.clock()
        if self.first_count is None:
            self.first_count = self.last_count
        self.window.add(self.last_count, done, tokens)

    def read(self, docs: int, tokens: int) -> None:
        """`docs` documents were read so far (tokenized or carried over), ahead of the
        model, and those of them to embed hold `tokens` tokens."""
        self.read_docs, self.read_tokens = docs, tokens

    @property
    def percent(self) -> int | None:
        """Whole percent done (99 until every document is), when the total is known."""
        if not self.total:
            return None
        return min(100, 100 * self.done // self.total)

    @property
    def eta(self) -> float | None:
        """Seconds until every document is done at the recent rate, when the total is known.

        Tokens left over tokens per second, where documents were read ahead: the tokens
        still to embed are those read and not embedded yet, plus, for the documents not
        read yet, as many per document as the read ones hold. Documents reach the model
        sorted by length within each window, so documents per second swing with their
        lengths (a run that starts with its longest documents would show an ETA several
        times too long), where tokens per second hold better. The rate is over the last
        `ETA_SHARE` of the time since the first batch (at most the rate window): a token of
        a long document costs more than one of a short one, and the batches to come are
        more like the last ones than the first."""
        if self.first_count is None:
            return None
        recent = min(self.window.span, (self.last_count - self.first_count) * ETA_SHARE)
        rates = self.window.rates(since=self.last_count - recent)
        if self.total is None or self.done >= self.total or rates is None:
            return None
        docs_per_second, tokens_per_second = rates
        if self.read_docs and self.read_tokens and tokens_per_second > 0:
            unread = max(0, self.total - self.read_docs)
            expected = self.read_tokens + unread * self.read_tokens / self.read_docs
            return max(0.0, expected - self.tokens) / tokens_per_second
        if docs_per_second <= 0:
            return None
        return max(0, self.total - self.done) / docs_per_second

    def counts(self) -> str:
        """`4,200/10,000 docs`, or `4,200 docs` while the total is unknown; `(3,000
        carried)` after, for those not embedded (carried over, or saved by an interrupted
        run)."""
        done = f"{self.done:,}" + (f"/{self.total:,}" if self.total else "") + " docs"
        return done + (f" ({self.carried:,} carried)" if self.carried else "")

    def rates(self) -> str:
        """`1,310 docs/s  402,118 tok/s`: documents and tokens the model embedded, over the
        seconds since the first batch, as the summary gives them; "" before a batch."""
        if self.mean is None or not any(self.mean):
            return ""
        return f"{self.mean[0]:,.0f} docs/s  {self.mean[1]:,.0f} tok/s"

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

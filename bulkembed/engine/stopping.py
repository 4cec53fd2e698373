"""Stopping a run on SIGINT or SIGTERM where it can keep its work.

While windows are embedded in the run's own process (inside `StopRequest.graceful`), the
first signal asks the run to stop: no batch goes to the model after those in flight, the
windows embedded whole are written (committing the units they end), and the vectors of
the other documents embedded so far are saved in the run directory
(`bulkembed.engine.saved`), for the next run to take instead of embedding them again. A
second signal, or one anywhere else (loading the model, several device processes, Ray),
stops the run at once: what is committed stays.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

Item = TypeVar("Item")


class StopRequest:
    """Whether a signal asked the run to stop (`signal_number`), and whether the run is
    where it can stop keeping its work (`graceful`)."""

    def __init__(self) -> None:
        self.signal_number: int | None = None
        self._notify: Callable[[str], None] | None = None
        self._noticed = False

    @property
    def requested(self) -> bool:
        """Whether a signal asked the run to stop."""
        return self.signal_number is not None

    @property
    def name(self) -> str:
        """The signal's name (`SIGINT`)."""
        assert self.signal_number is not None
        return signal.Signals(self.signal_number).name

    def ask(self, signal_number: int) -> bool:
        """Ask the run to stop, for `signal_number`: True where it stops keeping its work,
        False where it must stop at once (not inside `graceful`, or asked before)."""
        if self._notify is None or self.requested:
            return False
        self.signal_number = signal_number
        return True

    @contextlib.contextmanager
    def graceful(self, notify: Callable[[str], None]) -> Iterator[None]:
        """Where a signal asks the run to stop rather than stops it; the first time the run
        sees the request (`check`), `notify` is told what happens next."""
        self._notify = notify
        try:
            yield
        finally:
            self._notify = None

    def check(self) -> bool:
        """Whether the run is asked to stop; said once, the first time."""
        if not self.requested:
            return False
        if not self._noticed and self._notify is not None:
            self._noticed = True
            self._notify(
                f"{self.name}: stopping after the batches in flight and keeping every vector "
                f"embedded; send {self.name} again to stop at once"
            )
        return True

    def until(self, items: Iterable[Item]) -> Iterator[Item]:
        """`items`, up to the one after which the run is asked to stop."""
        for item in items:
            yield item
            if self.check():
                return

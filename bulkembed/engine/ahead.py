"""Read and tokenize ahead of the model, on a thread: the first window is ready by the time
the model has loaded and checked its dtype, and later windows are ready while the device is
busy.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

Item = TypeVar("Item")
# How long the thread waits on a full queue before it looks whether it should stop.
_WAIT_SECONDS = 0.2
# How long leaving the `with` block waits for the thread: it stops after its current item.
_JOIN_SECONDS = 5.0


class ReadAhead(Generic[Item]):
    """The items of `items`, in order, produced on a thread ahead of the consumer: queued
    up to a capacity of 1, where `cost(item)` is an item's share of it (at least one item
    is always queued), plus the next one, held until there is room. An error in `items`
    is raised in the consumer when it reaches that point. Leaving the `with` block stops
    the thread after its current item.

    >>> with ReadAhead(iter(range(5)), lambda n: 0.5) as ahead:
    ...     list(ahead)
    [0, 1, 2, 3, 4]
    """

    def __init__(self, items: Iterator[Item], cost: Callable[[Item], float]) -> None:
        self._items = items
        self._cost = cost
        self._held = 0.0
        self._room = threading.Condition()
        # (item, its cost); then None at the end, or the error that ended `items`.
        self._queue: queue.SimpleQueue[tuple[Item, float] | BaseException | None] = (
            queue.SimpleQueue()
        )
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="bulkembed-ahead", daemon=True)

    def __enter__(self) -> ReadAhead[Item]:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopping.set()
        with self._room:
            self._room.notify_all()
        self._thread.join(timeout=_JOIN_SECONDS)

    def _produce(self) -> None:
        try:
            for item in self._items:
                cost = self._cost(item)
                with self._room:
                    while self._held > 0 and self._held + cost > 1.0:
                        if self._stopping.is_set():
                            return
                        self._room.wait(_WAIT_SECONDS)
                    self._held += cost
                self._queue.put((item, cost))
                if self._stopping.is_set():
                    return
            self._queue.put(None)
        except BaseException as e:  # handed to the consumer, in order
            self._queue.put(e)

    def __iter__(self) -> Iterator[Item]:
        while True:
            found = self._queue.get()
            if found is None:
                return
            if isinstance(found, BaseException):
                raise found
            item, cost = found
            with self._room:
                self._held -= cost
                self._room.notify_all()
            yield item

"""Worker processes that cannot hang a run: the pool behind the tokenizers and the encoders.

Each worker is spawned, builds what it works with once (`start(setting)`, e.g. a tokenizer
or a model on its device), reports `READY`, then takes tasks from one shared queue until it
is told to stop, so a slower worker simply takes fewer. Tasks carry their number and
results come back in submission order, with at most `max_in_flight` queued. A worker that
fails reports `FAILED`; one that dies, or stays silent past its time limit, is found by the
parent on its next wait: either way the parent raises, never waits forever. Workers ignore
SIGINT and SIGTERM (the parent decides how to stop) and exit once their parent is gone.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from typing import Any, Generic, TypeVar

from bulkembed.errors import WorkerError

Key = TypeVar("Key")
Setting = TypeVar("Setting")
Task = TypeVar("Task")
Result = TypeVar("Result")
# How often a waiting parent checks that its workers are alive, and a worker its parent.
POLL_SECONDS = 1.0
PARENT_CHECK_SECONDS = 0.5


class Message(str, Enum):
    """What a worker reports: started (with what it says about itself), a task's result, or
    a failure (with its message)."""

    READY = "ready"
    DONE = "done"
    FAILED = "failed"


def exit_with_parent(parent: int) -> None:
    """End this worker once its parent is gone. A parent killed outright (SIGKILL, OOM
    killer) cannot shut its pool down, and a worker would otherwise wait forever for work."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(0)


def _work(
    start: Callable[[Any], tuple[Callable[[Any], Any], Any]],
    setting: Any,
    number: int,
    tasks: Any,
    results: Any,
    parent: int,
) -> None:
    """A worker's life: start, report, handle tasks until None comes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=exit_with_parent, args=(parent,), daemon=True).start()
    try:
        handle, about = start(setting)
    except Exception as e:  # reported to the parent, which raises it there
        results.put((Message.FAILED, number, f"{type(e).__name__}: {e}"))
        return
    results.put((Message.READY, number, about))
    while (task := tasks.get()) is not None:
        index, item = task
        try:
            result = handle(item)
        except Exception as e:
            results.put((Message.FAILED, number, f"{type(e).__name__}: {e}"))
            return
        results.put((Message.DONE, index, result))


class WorkerPool(Generic[Task, Result]):
    """One spawned worker per entry of `settings`, each started with `start(setting)` (a
    module-level function), which returns the task handler and what the worker says about
    itself (`ready`, in worker order). `role` names the workers in errors ("tokenizer"), and
    `places` says where each one runs ("cuda:0")."""

    def __init__(
        self,
        start: Callable[[Setting], tuple[Callable[[Task], Result], Any]],
        settings: list[Setting],
        role: str,
        places: list[str],
        start_timeout: float,
        result_timeout: float,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.role = role
        self.places = places
        self.result_timeout = result_timeout
        self._tasks = context.Queue()
        self._results = context.Queue()
        self._workers = [
            context.Process(
                target=_work,
                args=(start, setting, number, self._tasks, self._results, os.getpid()),
                name=f"bulkembed-{role}-{places[number]}",
                daemon=True,
            )
            for number, setting in enumerate(settings)
        ]
        for worker in self._workers:
            worker.start()
        ready: dict[int, Any] = {}
        try:
            while len(ready) < len(self._workers):
                _, number, about = self._next(Message.READY, start_timeout)
                ready[number] = about
        except BaseException:
            self.close(failed=True)
            raise
        self.ready = [ready[number] for number in range(len(self._workers))]

    def __len__(self) -> int:
        return len(self._workers)

    def _next(self, kind: Message, timeout: float) -> tuple[Message, int, Any]:
        """The next message from the workers, of `kind`; a failure, a death or `timeout`
        seconds of silence raise."""
        waited = 0.0
        while True:
            try:
                message = self._results.get(timeout=POLL_SECONDS)
            except queue.Empty:
                waited += POLL_SECONDS
                if not all(w.is_alive() for w in self._workers):
                    raise self._error("process died (killed, or out of memory?)") from None
                if waited >= timeout:
                    raise self._error(f"gave no result in {timeout:.0f} s") from None
                continue
            if message[0] is Message.FAILED:
                place = self.places[message[1]]
                raise WorkerError(f"the {self.role} on {place} failed: {message[2]}")
            assert message[0] is kind, message
            return message

    def _error(self, what: str) -> WorkerError:
        article = "an" if self.role[0] in "aeiou" else "a"
        return WorkerError(
            f"{article} {self.role} worker {what}; committed output is kept: run the same "
            "command again to resume"
        )

    def map(
        self, items: Iterable[tuple[Key, Task]], max_in_flight: int
    ) -> Iterator[tuple[Key, Result]]:
        """For each `(key, task)` of `items`, the key with the task's result, in the order of
        `items`, keeping at most `max_in_flight` tasks queued. Keys stay in this process."""
        keys: dict[int, Key] = {}
        found: dict[int, Result] = {}
        submitted = returned = 0
        pending = iter(items)
        while True:
            while submitted - returned < max_in_flight:
                item = next(pending, None)
                if item is None:
                    break
                keys[submitted], task = item
                self._tasks.put((submitted, task))
                submitted += 1
            if returned == submitted:
                return
            while returned not in found:
                _, index, result = self._next(Message.DONE, self.result_timeout)
                found[index] = result
            yield keys.pop(returned), found.pop(returned)
            returned += 1

    def close(self, failed: bool = False) -> None:
        """Stop the workers: asked to, once their queued tasks are done; after a failure
        (one of them may be stuck) killed at once."""
        if not failed:
            for worker in self._workers:
                if worker.is_alive():
                    self._tasks.put(None)
            for worker in self._workers:
                worker.join(timeout=10)
        for worker in self._workers:
            if worker.is_alive():
                worker.kill()
                worker.join()
        self._tasks.cancel_join_thread()
        self._results.cancel_join_thread()

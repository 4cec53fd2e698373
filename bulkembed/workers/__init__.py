"""Worker processes that cannot hang a run: the pool behind the tokenizers and the encoders.

Each worker is spawned, builds what it works with once (`start(setting)`, e.g. a tokenizer
or a model on its device), reports `READY`, then handles the tasks of its own queue in
order until it is told to stop. Tasks carry their number and results come back in
submission order, with at most `max_in_flight` sent out.

The parent hands each task to the live worker that holds the fewest, so a slower worker
simply gets fewer, and it always knows which tasks each worker holds. One queue per worker,
rather than one shared queue that workers take from, is what makes that exact: there is no
moment when a task has left a shared queue but its taker has not yet said so, and a worker
killed while waiting on its queue breaks no one else's. Each worker answers on its own pipe,
and the parent waits on the pipes and on the processes themselves, so it sees a result or a
death at once, without polling.

A task's handler may return a `Future` instead of its result: the worker goes on with its
next task, and the result is sent once the future is done (a worker that writes what it
embedded on a thread of its own). From inside a task, `report` sends the parent word of how
it goes; any word from a worker starts its task's time limit again.

A worker that fails reports `FAILED` and the run stops. One that dies (killed, out of
memory) stops the run too, unless the pool was made with `requeue`: then the tasks it held
go to the live workers, once each, and the run goes on; a task that was handed out again
already, or no live worker left, stops it. A task that takes longer than `task_timeout`
stops it as well, naming the worker. Either way the parent raises, never waits forever.
Workers ignore SIGINT and SIGTERM (the parent decides how to stop) and exit once their
parent is gone.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, TypeVar

from bulkembed.errors import WorkerError
from bulkembed.wording import counted
from bulkembed.workers.child import Message, report, work
from bulkembed.workers.script_guard import MAIN_GUARD_ADVICE, script_reruns

__all__ = ["WorkerPool", "report"]

Key = TypeVar("Key")
Setting = TypeVar("Setting")
Task = TypeVar("Task")
Result = TypeVar("Result")
# How long a worker told to stop may take to finish its queued tasks.
STOP_SECONDS = 10.0


class WorkerPool(Generic[Task, Result]):
    """One spawned worker per entry of `settings`, each started with `start(setting)` (a
    module-level function), which returns the task handler and what the worker says about
    itself (`ready`, in worker order). `role` names the workers in errors ("tokenizer"),
    `places` says where each one runs ("cuda:0") and `task` what one task is ("batch").
    `start_timeout` bounds the start, `task_timeout` each task from the moment its worker
    begins it or last `report`s on it (what a report marks done is a `step`: "batch").
    With `requeue`, the tasks of a worker that dies go to the others, and `warn` is told so
    in one line. With `wait` the pool is returned once every worker has started; without,
    at once, and the first `map` (or `ready`) waits for them: the caller does other work
    meanwhile (the run loads its model while the tokenizer processes start)."""

    def __init__(
        self,
        start: Callable[[Setting], tuple[Callable[[Task], Result | Future[Result]], Any]],
        settings: list[Setting],
        role: str,
        places: list[str],
        start_timeout: float,
        task_timeout: float,
        *,
        task: str = "task",
        step: str | None = None,
        requeue: bool = False,
        warn: Callable[[str], None] | None = None,
        wait: bool = True,
    ) -> None:
        reruns = script_reruns()
        if reruns is not None:
            raise WorkerError(f"cannot start {role} processes: {reruns}; {MAIN_GUARD_ADVICE}")
        context = multiprocessing.get_context("spawn")
        self.role = role
        self.places = places
        self.task = task
        self.step = step or task
        self.start_timeout = start_timeout
        self.task_timeout = task_timeout
        self.requeue = requeue
        self._warn = warn
        self._tasks = [context.Queue() for _ in settings]
        self._results: list[Connection] = []
        self._workers = []
        for number, setting in enumerate(settings):
            reader, writer = context.Pipe(duplex=False)
            worker = context.Process(
                target=work,
                args=(start, setting, self._tasks[number], writer, os.getpid()),
                name=f"bulkembed-{role}-{places[number]}",
                daemon=True,
            )
            worker.start()
            # The worker holds the only writing end now: its death reads as end of file.
            writer.close()
            self._results.append(reader)
            self._workers.append(worker)
        self._live = set(range(len(settings)))
        # The tasks handed to each worker and not answered yet, in the order it takes them,
        # and since when it works on the first of them.
        self._held: list[dict[int, Task]] = [{} for _ in settings]
        self._since = [0.0] * len(settings)
        self._handed_again: set[int] = set()
        self._submitted = 0
        self._starting = True
        self._failed = False
        self._ready: dict[int, Any] = {}
        self._start_deadline = time.monotonic() + start_timeout
        if wait:
            self._await_start()

    def _await_start(self) -> None:
        """Wait until every worker has started (within `start_timeout` of the pool's own
        start), unless they have."""
        if not self._starting:
            return
        try:
            while len(self._ready) < len(self._workers):
                number, (_, about) = self._next(self._start_deadline)
                self._ready[number] = about
        except BaseException:
            self.close(failed=True)
            raise
        self._starting = False

    @property
    def ready(self) -> list[Any]:
        """What each worker said about itself as it started, in worker order."""
        self._await_start()
        return [self._ready[number] for number in range(len(self._workers))]

    def __len__(self) -> int:
        return len(self._workers)

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [worker.pid for worker in self._workers if worker.pid is not None]

    def _next(self, start_deadline: float | None = None) -> tuple[int, tuple[Any, ...]]:
        """The next message from a live worker, with the worker's number. A failure raises;
        a death hands the worker's tasks on, or raises; so does a time limit run out: the
        `start_deadline` while the workers start, afterwards `task_timeout` for the task
        each worker is on. After an error, `close` kills the workers at once."""
        try:
            return self._receive(start_deadline)
        except WorkerError:
            self._failed = True
            raise

    def _receive(self, start_deadline: float | None) -> tuple[int, tuple[Any, ...]]:
        """`_next`, before an error is remembered."""
        while True:
            if start_deadline is None:
                deadline, late = self._task_deadline()
            else:
                deadline, late = start_deadline, None
            live = sorted(self._live)
            waiting = [self._results[n] for n in live] + [self._workers[n].sentinel for n in live]
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(waiting, timeout)
            if not ready:
                raise self._late(late)
            for number in live:
                connection = self._results[number]
                if connection not in ready and self._workers[number].sentinel not in ready:
                    continue
                message = None
                if connection.poll():
                    with contextlib.suppress(EOFError, OSError):
                        message = connection.recv()
                if message is None:
                    self._died(number)
                    break
                if message[0] is Message.FAILED:
                    place = self.places[number]
                    raise WorkerError(f"the {self.role} on {place} failed: {message[1]}")
                return number, message

    def _task_deadline(self) -> tuple[float | None, int | None]:
        """When the first task that workers are on runs out of time, and whose it is."""
        busy = [number for number in self._live if self._held[number]]
        if not busy:
            return None, None
        number = min(busy, key=lambda n: self._since[n])
        return self._since[number] + self.task_timeout, number

    def _late(self, number: int | None) -> WorkerError:
        """The error of a time limit run out: a worker's task, or the start."""
        if number is None:
            waiting = sorted({self.places[n] for n in self._live if n not in self._ready})
            return WorkerError(
                f"the {self.role} on {', '.join(waiting)} did not start in {self.start_timeout:g} s"
            )
        return WorkerError(
            f"the {self.role} on {self.places[number]} took more than "
            f"{self.task_timeout:g} s for one {self.step} (stuck or hung?); committed "
            "output is kept: run the same command again to resume"
        )

    def _died(self, number: int) -> None:
        """Worker `number` is gone: with `requeue`, its tasks go to the live workers; raise
        if it cannot be (not asked for, still starting, none left, or a task's second
        death)."""
        self._live.discard(number)
        self._workers[number].join(timeout=STOP_SECONDS)
        lost, self._held[number] = self._held[number], {}
        if (
            not self.requeue
            or self._starting
            or not self._live
            or not self._handed_again.isdisjoint(lost)
        ):
            article = "an" if self.role[0] in "aeiou" else "a"
            raise WorkerError(
                f"{article} {self.role} worker process died (killed, or out of memory?); "
                "committed output is kept: run the same command again to resume"
            )
        if self._warn is not None:
            others = ", ".join(self.places[n] for n in sorted(self._live))
            self._warn(
                f"the {self.role} on {self.places[number]} died (killed, or out of memory?): "
                f"its {counted(len(lost), self.task)} in flight run again on {others}"
            )
        for index, task in lost.items():
            self._handed_again.add(index)
            self._hand_out(index, task)

    def _hand_out(self, index: int, task: Task) -> None:
        """Send task `index` to the live worker that holds the fewest."""
        number = min(self._live, key=lambda n: (len(self._held[n]), n))
        if not self._held[number]:
            self._since[number] = time.monotonic()
        self._held[number][index] = task
        self._tasks[number].put((index, task))

    def _result(self, progress: Callable[[int, Any], None]) -> tuple[int, Result]:
        """The next task's number and result, from whichever worker is first; what workers
        `report` meanwhile goes to `progress`, with the task's number."""
        while True:
            number, (kind, index, payload) = self._next()
            # Word from a worker: it is alive, and on its next task once it gave a result.
            self._since[number] = time.monotonic()
            if kind is Message.PROGRESS:
                progress(index, payload)
                continue
            assert kind is Message.DONE, kind
            del self._held[number][index]
            return index, payload

    def map(
        self,
        items: Iterable[tuple[Key, Task]],
        max_in_flight: int,
        progress: Callable[[Key, Any], None] | None = None,
    ) -> Iterator[tuple[Key, Result]]:
        """For each `(key, task)` of `items`, the key with the task's result, in the order of
        `items`, keeping at most `max_in_flight` tasks out. Keys stay in this process. What a
        task `report`s goes to `progress` with its key (a task run again after its worker
        died reports from the start again)."""
        keys: dict[int, Key] = {}

        def reported(index: int, payload: Any) -> None:
            if progress is not None and index in keys:
                progress(keys[index], payload)

        self._await_start()
        found: dict[int, Result] = {}
        out: deque[int] = deque()
        pending = iter(items)
        while True:
            while len(out) < max_in_flight and (item := next(pending, None)) is not None:
                index = self._submitted
                self._submitted += 1
                keys[index], task = item
                out.append(index)
                self._hand_out(index, task)
            if not out:
                return
            first = out.popleft()
            while first not in found:
                index, result = self._result(reported)
                found[index] = result
            yield keys.pop(first), found.pop(first)

    def close(self, failed: bool = False) -> None:
        """Stop the workers: asked to, once their queued tasks are done; after a failure,
        here or told of (one of them may be stuck), killed at once."""
        if not failed and not self._failed:
            for number in self._live:
                self._tasks[number].put(None)
            for worker in self._workers:
                worker.join(timeout=STOP_SECONDS)
        for worker in self._workers:
            if worker.is_alive():
                worker.kill()
                worker.join()
        for tasks in self._tasks:
            tasks.cancel_join_thread()
        for connection in self._results:
            connection.close()

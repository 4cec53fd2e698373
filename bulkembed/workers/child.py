"""A worker process's side of `WorkerPool`: started, it serves the tasks of its queue in
order, sends its messages on a thread of its own, and exits once its parent is gone."""

from __future__ import annotations

import functools
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from enum import Enum
from multiprocessing.connection import Connection
from typing import Any

# How often a worker checks that its parent is alive.
PARENT_CHECK_SECONDS = 0.5


class Message(str, Enum):
    """What a worker reports: started (with what it says about itself), how a task goes
    (with its number, see `report`), a task's result (with its number), or a failure (with
    its message)."""

    READY = "ready"
    PROGRESS = "progress"
    DONE = "done"
    FAILED = "failed"


class _Current:
    """In a worker process: where its messages go, and the number of the task it is on."""

    outbox: queue.SimpleQueue[Any] | None = None
    task = -1


def report(payload: Any) -> None:
    """Send the parent `payload` about the task this worker is on (the `progress` given to
    `WorkerPool.map` gets it); the task's time limit starts again. Outside a worker, or
    outside a task, nothing happens."""
    if _Current.outbox is not None and _Current.task >= 0:
        _Current.outbox.put((Message.PROGRESS, _Current.task, payload))


def exit_with_parent(parent: int) -> None:
    """End this worker once its parent is gone. A parent killed outright (SIGKILL, OOM
    killer) cannot shut its pool down, and a worker would otherwise wait forever for work."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(0)


def _send(outbox: queue.SimpleQueue[Any], results: Connection) -> None:
    """Send a worker's messages to its parent until None comes, so that the worker goes on
    with its next task while the parent is busy elsewhere."""
    while (message := outbox.get()) is not None:
        results.send(message)


def _serve(
    start: Callable[[Any], tuple[Callable[[Any], Any], Any]],
    setting: Any,
    tasks: Any,
    outbox: queue.SimpleQueue[Any],
) -> None:
    """Start, report, handle tasks until None comes or one fails."""
    try:
        handle, about = start(setting)
    except Exception as e:  # reported to the parent, which raises it there
        outbox.put((Message.FAILED, f"{type(e).__name__}: {e}"))
        return
    outbox.put((Message.READY, about))
    _Current.outbox = outbox
    # One event per answer still to come from a future, set once the answer is sent.
    later: list[threading.Event] = []
    while (task := tasks.get()) is not None:
        index, item = task
        _Current.task = index
        try:
            result = handle(item)
        except Exception as e:
            outbox.put((Message.FAILED, f"{type(e).__name__}: {e}"))
            return
        finally:
            _Current.task = -1
        if isinstance(result, Future):
            sent = threading.Event()
            later = [*(e for e in later if not e.is_set()), sent]
            result.add_done_callback(functools.partial(_settled, outbox, index, sent))
        else:
            outbox.put((Message.DONE, index, result))
    for sent in later:
        sent.wait()


def _settled(
    outbox: queue.SimpleQueue[Any], index: int, sent: threading.Event, future: Future[Any]
) -> None:
    """Send the outcome of task `index`, whose handler returned `future`; then set `sent`."""
    error = future.exception()
    if error is None:
        outbox.put((Message.DONE, index, future.result()))
    else:
        outbox.put((Message.FAILED, f"{type(error).__name__}: {error}"))
    sent.set()


def work(
    start: Callable[[Any], tuple[Callable[[Any], Any], Any]],
    setting: Any,
    tasks: Any,
    results: Connection,
    parent: int,
) -> None:
    """A worker's life: its tasks served, its messages sent, until it is told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=exit_with_parent, args=(parent,), daemon=True).start()
    outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    sender = threading.Thread(target=_send, args=(outbox, results))
    sender.start()
    try:
        _serve(start, setting, tasks, outbox)
    finally:
        outbox.put(None)
        sender.join()

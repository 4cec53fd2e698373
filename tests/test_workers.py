"""`WorkerPool`: results in order; a dead worker's tasks handed to the others once; a stuck
task is an error naming its worker."""

import os
import signal
import time
from functools import partial
from pathlib import Path

import pytest

from bulkembed.errors import WorkerError
from bulkembed.workers import WorkerPool


def _claim(marker: Path) -> bool:
    """True for the first process to create `marker`, False for every other."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _square(folder: Path, task: tuple[int, str]) -> int:
    """`n * n`, unless the task says otherwise: `die once` kills the first worker that
    takes it, `die` every one, `hang` never answers, `slow` takes 0.4 s."""
    number, what = task
    if what == "die" or (what == "die once" and _claim(folder / f"{number}")):
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "hang":
        time.sleep(600)
    if what == "slow":
        time.sleep(0.4)
    return number * number


def _start(folder: str) -> tuple[partial[int], int]:
    return partial(_square, Path(folder)), os.getpid()


def _pool(tmp_path, workers, task_timeout=60.0, requeue=True, warnings=None):
    places = [f"w{n}" for n in range(workers)]
    warn = None if warnings is None else warnings.append
    start = [str(tmp_path)] * workers
    return WorkerPool(
        _start, start, "squarer", places, 60.0, task_timeout, requeue=requeue, warn=warn
    )


def _tasks(n, special):
    return ((i, (i, special.get(i, ""))) for i in range(n))


def test_a_dead_workers_tasks_go_to_the_others_and_results_stay_in_order(tmp_path):
    warnings: list[str] = []
    pool = _pool(tmp_path, 2, warnings=warnings)
    try:
        results = list(pool.map(_tasks(30, {7: "die once"}), max_in_flight=6))
        assert results == [(i, i * i) for i in range(30)]
        assert (tmp_path / "7").exists()
        [warning] = warnings
        assert warning.startswith("the squarer on w")
        assert "died (killed, or out of memory?): its " in warning
        # The survivor goes on alone.
        assert list(pool.map(_tasks(5, {}), max_in_flight=3)) == [(i, i * i) for i in range(5)]
    finally:
        pool.close()


def test_without_requeue_a_dead_worker_stops_the_run(tmp_path):
    pool = _pool(tmp_path, 2, requeue=False)
    try:
        with pytest.raises(WorkerError, match="^a squarer worker process died"):
            list(pool.map(_tasks(10, {3: "die once"}), max_in_flight=4))
    finally:
        pool.close(failed=True)


def test_a_task_that_kills_the_worker_it_goes_to_again_stops_the_run(tmp_path):
    warnings: list[str] = []
    pool = _pool(tmp_path, 3, warnings=warnings)
    try:
        with pytest.raises(WorkerError, match="^a squarer worker process died"):
            list(pool.map(_tasks(10, {4: "die"}), max_in_flight=4))
        # Handed out again once, after the first death only; a third worker was left.
        assert len(warnings) == 1
        assert len(pool._live) == 1
    finally:
        pool.close(failed=True)


def test_the_last_worker_dying_stops_the_run(tmp_path):
    pool = _pool(tmp_path, 1, warnings=[])
    try:
        with pytest.raises(WorkerError, match="^a squarer worker process died"):
            list(pool.map(_tasks(5, {2: "die once"}), max_in_flight=2))
    finally:
        pool.close(failed=True)


def test_a_stuck_task_is_an_error_naming_its_worker(tmp_path):
    pool = _pool(tmp_path, 2, task_timeout=1.0)
    started = time.monotonic()
    try:
        with pytest.raises(WorkerError) as caught:
            list(pool.map(_tasks(10, {5: "hang"}), max_in_flight=4))
    finally:
        pool.close(failed=True)
    assert time.monotonic() - started < 10
    [worker] = [n for n, w in enumerate(pool._workers) if 5 in pool._held[n]]
    assert str(caught.value) == (
        f"the squarer on w{worker} took more than 1 s for one task (stuck or hung?); "
        "committed output is kept: run the same command again to resume"
    )
    assert not any(w.is_alive() for w in pool._workers)


def test_the_time_limit_is_per_task_not_per_queue(tmp_path):
    # Eight tasks of 0.4 s queued on one worker at once: 3.2 s in all, none over 1 s.
    pool = _pool(tmp_path, 1, task_timeout=1.0)
    try:
        slow = dict.fromkeys(range(8), "slow")
        assert list(pool.map(_tasks(8, slow), max_in_flight=8)) == [(i, i * i) for i in range(8)]
    finally:
        pool.close()


def _start_slowly(folder: str) -> tuple[partial[int], int]:
    time.sleep(600)
    return _start(folder)


def test_a_worker_that_does_not_start_in_time_is_an_error_naming_it(tmp_path):
    started = time.monotonic()
    with pytest.raises(WorkerError, match="^the squarer on w0 did not start in 1.5 s$"):
        WorkerPool(_start_slowly, [str(tmp_path)], "squarer", ["w0"], 1.5, 60.0)
    assert time.monotonic() - started < 10


def _start_when_told(folder: str) -> tuple[partial[int], int]:
    """Start once `folder/go` exists (at most two minutes: past the pools' start time)."""
    deadline = time.monotonic() + 120
    while not (Path(folder) / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return partial(_square, Path(folder)), os.getpid()


def test_a_pool_that_does_not_wait_returns_before_its_workers_start(tmp_path):
    # Its workers start only once this process has the pool back: a pool that waited for
    # them would run out of its 60 s start and raise.
    pool = WorkerPool(
        _start_when_told, [str(tmp_path)] * 2, "squarer", ["w0", "w1"], 60.0, 60.0, wait=False
    )
    try:
        (tmp_path / "go").touch()
        assert list(pool.map(_tasks(6, {}), max_in_flight=4)) == [(i, i * i) for i in range(6)]
        assert len(pool.ready) == 2 and all(isinstance(pid, int) for pid in pool.ready)
    finally:
        pool.close()


def test_a_worker_that_fails_to_start_fails_the_first_map_of_a_pool_that_did_not_wait(tmp_path):
    pool = WorkerPool(_start_failing, [str(tmp_path)], "squarer", ["w0"], 60.0, 60.0, wait=False)
    with pytest.raises(WorkerError, match="the squarer on w0 failed: .*no tokenizer here"):
        list(pool.map(_tasks(2, {}), max_in_flight=2))
    pool.close(failed=True)


def _start_failing(folder: str) -> tuple[partial[int], int]:
    raise ValueError("no tokenizer here")

"""The run directory's lock: one run per output, or per `--shard`; a dead holder's lock is
taken over."""

import multiprocessing
import os
import signal

import pytest

from bulkembed.config import ShardSpec
from bulkembed.run_dir import LockedError, RunDirectory


def _hold(output, shard, ready):
    """In a child process: take the lock and wait to be killed."""
    run = RunDirectory(output, shard=shard)
    run.meta.mkdir(parents=True, exist_ok=True)
    run.acquire_lock()
    ready.set()
    signal.pause()


def test_a_second_run_is_refused_naming_the_holder_until_the_first_lets_go(tmp_path):
    (tmp_path / "_bulkembed").mkdir()
    first = RunDirectory(tmp_path)
    first.acquire_lock()
    assert first.lock_holder() == f"pid {os.getpid()} on {os.uname().nodename}"
    with pytest.raises(LockedError, match=rf"{tmp_path} is in use by a running bulkembed \(pid"):
        RunDirectory(tmp_path).acquire_lock()
    first.release_lock()
    assert first.lock_holder() is None
    second = RunDirectory(tmp_path)
    second.acquire_lock()
    second.release_lock()


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path):
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    holder = context.Process(target=_hold, args=(tmp_path, None, ready))
    holder.start()
    try:
        assert ready.wait(60)
        assert RunDirectory(tmp_path).lock_holder() == f"pid {holder.pid} on {os.uname().nodename}"
        with pytest.raises(LockedError):
            RunDirectory(tmp_path).acquire_lock()
    finally:
        holder.kill()
        holder.join()
    run = RunDirectory(tmp_path)
    assert run.lock_holder() is None
    run.acquire_lock()
    assert run.lock_holder() is not None
    run.release_lock()


def test_the_same_shard_cannot_run_twice_at_once(tmp_path):
    (tmp_path / "_bulkembed").mkdir()
    first = RunDirectory(tmp_path, shard=ShardSpec(0, 2))
    other = RunDirectory(tmp_path, shard=ShardSpec(1, 2))
    first.acquire_lock()
    other.acquire_lock()
    with pytest.raises(LockedError, match=r"shard 0/2 of .* is in use by a running bulkembed"):
        RunDirectory(tmp_path, shard=ShardSpec(0, 2)).acquire_lock()
    with pytest.raises(LockedError, match="in use by a running bulkembed .runs with --shard."):
        RunDirectory(tmp_path).acquire_lock()
    assert first.lock_holder() == "runs with --shard"
    first.release_lock()
    other.release_lock()
    assert first.lock_holder() is None
    RunDirectory(tmp_path).acquire_lock()

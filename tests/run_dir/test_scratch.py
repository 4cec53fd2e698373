"""Temporary folders and spool files of a run: the next run removes those whose owner is
gone, and only those: an owner holds a lock on them, which a run of another PID namespace
or host sharing the temporary directory sees, where it cannot see the owner's process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from helpers import records, run_arguments, write_jsonl

import bulkembed.storage
from bulkembed.storage import Spool, scratch_folder
from bulkembed.storage.objects import ObjectPath

# A process id that no process of this machine has (above Linux's largest, 2**22).
UNSEEN_PID = 2**22 + 12345

_HOLD = """
import sys, time
from pathlib import Path
from bulkembed.storage.scratch import locked_file
folder = Path(sys.argv[1])
folder.mkdir()
(folder / "lookup.npy").write_bytes(b"x")
(folder / ".lock.new").touch()
handle = locked_file(folder / ".lock.new", folder / ".lock")
print("held", flush=True)
time.sleep(600)
"""


@pytest.fixture
def shared_tmp(tmp_path, monkeypatch):
    """A temporary directory of this test's, as the shared one of several runs."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _held_elsewhere(folder: Path) -> subprocess.Popen:
    """A process that makes `folder` and holds its lock, as a run of another PID namespace
    would (`folder` names a process id not alive here)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(folder)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_only_folders_whose_lock_no_one_holds_are_removed(shared_tmp):
    script = "from bulkembed.storage import scratch_folder as s; print(s('previous'))"
    made = subprocess.run(
        [sys.executable, "-c", script],
        check=True,
        capture_output=True,
        text=True,
    )
    # Its process ended without removing it, as a killed run does: its lock went with it.
    gone = Path(made.stdout.strip())
    assert (gone / ".lock").exists()
    held = shared_tmp / f"bulkembed-previous-{UNSEEN_PID}-abc"
    holder = _held_elsewhere(held)
    try:
        # A folder with no lock file: one being made, or an earlier bulkembed's: left alone.
        unlocked = shared_tmp / f"bulkembed-previous-{UNSEEN_PID}-def"
        unlocked.mkdir()
        other_kind = scratch_folder("stream")
        mine = scratch_folder("previous")
        left = sorted(p.name for p in shared_tmp.iterdir())
        assert left == sorted([held.name, unlocked.name, other_kind.name, mine.name])
        assert (held / "lookup.npy").read_bytes() == b"x"
    finally:
        holder.kill()
        holder.wait()
    # Its holder gone, the folder goes with the next sweep; the live one of this process stays.
    again = scratch_folder("previous")
    assert not held.exists() and mine.exists() and again.exists()
    bulkembed.storage.remove_scratch(mine)
    assert not mine.exists()


def test_spool_files_of_other_namespaces_are_kept_while_held(shared_tmp):
    target = ObjectPath("s3", "bucket/out/part-00000-000000.parquet")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import time
                from bulkembed.storage import Spool
                from bulkembed.storage.objects import ObjectPath
                spool = Spool.for_target(ObjectPath("s3", "bucket/out/p.parquet"))
                print(spool.local, flush=True)
                time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(shared_tmp)},
    )
    try:
        assert holder.stdout is not None
        live = Path(holder.stdout.readline().strip())
        # As a run of another PID namespace sees it: its process id is not alive there.
        seen = live.with_name(live.name.replace(f"-{holder.pid}-", f"-{UNSEEN_PID}-"))
        live.rename(seen)
        dead = shared_tmp / f"bulkembed-spool-{UNSEEN_PID}-xyz-p.parquet"
        dead.write_bytes(b"left by a killed run")
        Spool.remove_orphans()
        assert seen.exists() and not dead.exists()
    finally:
        holder.kill()
        holder.wait()
    Spool.remove_orphans()
    assert not seen.exists()
    mine = Spool.for_target(target)
    Spool.remove_orphans()
    assert mine.local.exists()
    mine.discard()
    assert not mine.local.exists()


def test_a_live_stream_survives_a_run_that_cannot_see_its_process(shared_tmp, tiny_st, monkeypatch):
    corpus = write_jsonl(shared_tmp / "input" / "c.jsonl", records(400))
    arguments = run_arguments(corpus, tiny_st("mean"), "-", "--records-per-unit", "50", "--quiet")
    environment = {**os.environ, "TMPDIR": str(shared_tmp)}
    stream = subprocess.Popen(
        [sys.executable, "-m", "bulkembed", *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment,
    )
    assert stream.stdout is not None
    # Its stdout unread, the run blocks once the pipe is full: alive, its folder in use.
    first = stream.stdout.readline()
    folders = []
    while not folders:
        folders = list(shared_tmp.glob("bulkembed-stream-*"))
    # A run whose PID namespace is another one: no process of this machine is alive to it.
    monkeypatch.setattr(bulkembed.storage, "process_alive", lambda pid: False)
    scratch_folder("stream")
    rest = stream.stdout.read()  # what the buffer holds beyond the first line too
    assert stream.stderr is not None
    errors = stream.stderr.read()
    assert stream.wait(timeout=300) == 0, errors.decode()
    ids = [json.loads(line)["id"] for line in (first + rest).splitlines()]
    assert sorted(ids) == sorted(r["id"] for r in records(400))

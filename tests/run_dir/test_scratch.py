"""Temporary folders of a run that a killed process left are removed by the next run."""

import os
import subprocess
import sys
import tempfile

from bulkembed.storage import scratch_folder


def test_folders_of_processes_that_are_gone_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = tmp_path / f"bulkembed-previous-{gone.stdout.strip()}-abc"
    (dead / "keys.npy").parent.mkdir()
    (dead / "keys.npy").write_bytes(b"x")
    alive = tmp_path / f"bulkembed-previous-{os.getppid()}-def"
    alive.mkdir()
    other = tmp_path / f"bulkembed-stream-{gone.stdout.strip()}-ghi"
    other.mkdir()
    mine = scratch_folder("previous")
    assert mine.parent == tmp_path and mine.name.startswith(f"bulkembed-previous-{os.getpid()}-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name, mine.name])

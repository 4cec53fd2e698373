"""Run the `bulkembed` CLI and send this process a signal at the Nth pass through a stage.

    python fault_harness.py STAGE N SIGNAL -- run INPUT --model ... --output ...

Stages: tokenize (a tokenized chunk reaches the main process), encode (before a batch runs
on the model), write (rows just went into a temporary part), commit (a part is renamed into
place but its unit not yet marked done), marked (just after a unit is marked done), fragments
(rows were just written as LanceDB data files, not committed yet), append (a unit's
fragments were just committed to a LanceDB table, its unit not yet marked done), compacted
(a finished LanceDB table was just compacted, its index not built yet), indexed (an index of
it was just built), committed (a Parquet part or `--since` upserts file was just committed),
deletes (the `--since` deletes were just written, the output not yet marked complete),
merged (a unit's rows were just merged into a LanceDB table synced in place, its unit not
yet marked done), deleted (ids gone from the input were just deleted from such a table).
"""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from lancedb.table import LanceTable

from bulkembed import cli
from bulkembed.batching import tokenize
from bulkembed.encoders.base import Encoder
from bulkembed.run_dir import RunDirectory
from bulkembed.sinks.change_set import ParquetChangeSet
from bulkembed.sinks.lance import LanceSink
from bulkembed.sinks.lance_sync import TableMerge
from bulkembed.sinks.parquet import ParquetSink

STAGES = {
    "tokenize": (tokenize, "_tokenized", False),
    "encode": (Encoder, "launch", False),
    "write": (ParquetSink, "write", True),
    "commit": (RunDirectory, "mark_done", False),
    "marked": (RunDirectory, "mark_done", True),
    "fragments": (LanceSink, "_flush", True),
    "append": (LanceSink, "_append", True),
    "compacted": (LanceTable, "optimize", True),
    "indexed": (LanceTable, "create_index", True),
    "committed": (ParquetSink, "commit", True),
    "deletes": (ParquetChangeSet, "write_deletes", True),
    "merged": (TableMerge, "commit", True),
    "deleted": (LanceTable, "delete", True),
}


def signal_at(stage: str, n: int, signal_number: int) -> None:
    owner, name, after = STAGES[stage]
    original = getattr(owner, name)
    calls = 0

    def wrapper(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == n and not after:
            os.kill(os.getpid(), signal_number)
        result = original(*args, **kwargs)
        if calls == n and after:
            os.kill(os.getpid(), signal_number)
            if threading.current_thread() is not threading.main_thread():
                # Python handles signals on the main thread: let it, before this thread
                # goes on, as it would in the time a real write takes.
                time.sleep(1)
        return result

    setattr(owner, name, wrapper)


def run_forked(
    stage: str, n: int, signal_name: str, arguments: list[str], timeout: float = 300
) -> subprocess.CompletedProcess:
    """What `python fault_harness.py STAGE N SIGNAL -- ARGUMENTS` does, in a forked child of
    this process, which has torch imported already: a test that kills many runs saves the
    seconds each new interpreter takes to start. The child computes on one thread, since
    OpenMP's thread pool does not survive a fork. Not for LanceDB runs: its runtime does
    not survive a fork either."""
    import torch

    with tempfile.TemporaryFile() as errors:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.dup2(errors.fileno(), 2)
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115
                os.environ["TOKENIZERS_PARALLELISM"] = "false"
                torch.set_num_threads(1)
                signal_at(stage, n, getattr(signal, signal_name))
                try:
                    cli.app(arguments, prog_name="bulkembed")
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        deadline = time.monotonic() + timeout
        while (status := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired(arguments, timeout)
            time.sleep(0.02)
        errors.seek(0)
        stderr = errors.read().decode("utf-8", errors="replace")
    return subprocess.CompletedProcess(arguments, os.waitstatus_to_exitcode(status[1]), "", stderr)


if __name__ == "__main__":
    stage, n, name, separator, *arguments = sys.argv[1:]
    assert separator == "--"
    signal_at(stage, int(n), getattr(signal, name))
    sys.argv = ["bulkembed", *arguments]
    cli.main()

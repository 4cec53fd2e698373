"""Run the `bulkembed` CLI and send this process a signal at the Nth pass through a stage.

    python fault_harness.py STAGE N SIGNAL -- run INPUT --model ... --output ...

Stages: tokenize (a tokenized chunk reaches the main process), encode (before a batch runs
on the model), write (rows just went into a temporary part), commit (a part is renamed into
place but its unit not yet marked done), marked (just after a unit is marked done), append
(rows were just appended to a LanceDB table), compacted (a finished LanceDB table was just
compacted, its index not built yet), indexed (an index of it was just built).
"""

import os
import signal
import sys
import threading
import time

from lancedb.table import LanceTable

from bulkembed import cli, tokenize
from bulkembed.checkpoint import RunDirectory
from bulkembed.encoders.base import Encoder
from bulkembed.sinks.lance import LanceSink
from bulkembed.sinks.parquet import ParquetSink

STAGES = {
    "tokenize": (tokenize, "_tokenized", False),
    "encode": (Encoder, "embed_within_memory", False),
    "write": (ParquetSink, "write", True),
    "commit": (RunDirectory, "mark_done", False),
    "marked": (RunDirectory, "mark_done", True),
    "append": (LanceSink, "_flush", True),
    "compacted": (LanceTable, "optimize", True),
    "indexed": (LanceTable, "create_index", True),
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


if __name__ == "__main__":
    stage, n, name, separator, *arguments = sys.argv[1:]
    assert separator == "--"
    signal_at(stage, int(n), getattr(signal, name))
    sys.argv = ["bulkembed", *arguments]
    cli.main()

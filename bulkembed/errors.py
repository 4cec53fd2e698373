"""Errors a user can act on, and the exit status of each. The CLI prints them as one line,
without a traceback, and exits with the error's `exit_code`."""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class ExitCode(IntEnum):
    """The exit status of `bulkembed run` (and the other commands), one meaning each."""

    DONE = 0
    # A run that failed: the model, the output, a worker, an unexpected error.
    FAILED = 1
    # Bad option values, conflicting options, an unknown recipe, a missing input.
    USAGE = 2
    # The run finished, but set aside more bad records than --max-bad-records allows.
    TOO_MANY_BAD_RECORDS = 3
    # An incremental run finished without its deletes: more than --max-deletes allows.
    TOO_MANY_DELETES = 4
    # The output is in use by another run (EX_TEMPFAIL): retry later.
    OUTPUT_LOCKED = 75
    # Stopped by SIGINT (128 + 2) or SIGTERM (128 + 15); committed parts are kept.
    INTERRUPTED = 130
    TERMINATED = 143
    # The reader of --output - closed the pipe (128 + SIGPIPE).
    PIPE_CLOSED = 141


class BulkembedError(Exception):
    """A problem with the input, the options or the environment, explained in one line."""

    exit_code: ClassVar[int] = ExitCode.FAILED


class UsageError(BulkembedError):
    """An option value, a combination of options or an input path the run cannot take."""

    exit_code: ClassVar[int] = ExitCode.USAGE


class InputError(BulkembedError):
    """An input path, file or column is missing or unreadable."""


class ModelError(BulkembedError):
    """The model cannot be found, loaded or used as configured."""


class OutputError(BulkembedError):
    """The output cannot be created or written."""


class OutputLocked(OutputError):
    """Another run holds the output (its lock, its lease, or the right to finish it)."""

    exit_code: ClassVar[int] = ExitCode.OUTPUT_LOCKED


class TooManyBadRecords(BulkembedError):
    """The run finished and committed everything, but set aside more bad records than
    `--max-bad-records` allows. `summary` is the run's `Summary`, as `embed_corpus` would
    have returned it."""

    exit_code: ClassVar[int] = ExitCode.TOO_MANY_BAD_RECORDS

    def __init__(self, message: str, summary: object = None) -> None:
        super().__init__(message)
        self.summary = summary


class TooManyDeletes(BulkembedError):
    """An incremental run (`--since`) finished and committed its new and changed documents,
    but deleted nothing: its input lost more of the previous output's ids than
    `--max-deletes` allows. `summary` is the run's `Summary`."""

    exit_code: ClassVar[int] = ExitCode.TOO_MANY_DELETES

    def __init__(self, message: str, summary: object = None) -> None:
        super().__init__(message)
        self.summary = summary


class WorkerError(BulkembedError):
    """A worker process died or failed."""


class Interrupted(BulkembedError):
    """SIGINT or SIGTERM stopped the run; what was committed stays."""

    def __init__(self, signal_number: int, message: str) -> None:
        super().__init__(message)
        self.signal_number = signal_number

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        """128 + the signal's number, as for a process the signal ended."""
        return 128 + self.signal_number


class UnaccountedRows(OutputError):
    """A LanceDB table holds rows that the done units and intents read do not account for:
    damage, or a ledger read before another shard marked its last units done and compacted
    the table (read the ledger again to tell)."""


class PipeClosed(OutputError):
    """The reader of `--output -` closed the pipe; the run stops there."""

    exit_code: ClassVar[int] = ExitCode.PIPE_CLOSED


def exit_status(error: BaseException) -> int:
    """The exit status of a run that `error` ended (`ExitCode.FAILED` for one bulkembed
    did not foresee)."""
    return int(getattr(error, "exit_code", ExitCode.FAILED))


def one_line(error: BaseException) -> str:
    """`error` as the CLI prints it: a bulkembed error's message; another error's type and
    message."""
    text = " ".join(str(error).splitlines())
    if isinstance(error, BulkembedError):
        return text
    kind = f"{type(error).__module__}.{type(error).__qualname__}".removeprefix("builtins.")
    return f"{kind}: {text}"

"""Errors a user can act on. The CLI prints them as one line, without a traceback."""


class BulkembedError(Exception):
    """A problem with the input, the options or the environment, explained in one line."""


class InputError(BulkembedError):
    """An input path, file or column is missing or unreadable."""


class ModelError(BulkembedError):
    """The model cannot be found, loaded or used as configured."""


class OutputError(BulkembedError):
    """The output cannot be created or written."""


class WorkerError(BulkembedError):
    """A worker process died or failed."""


class Interrupted(BulkembedError):
    """SIGINT or SIGTERM stopped the run; what was committed stays."""

    def __init__(self, signal_number: int, message: str) -> None:
        super().__init__(message)
        self.signal_number = signal_number


class PipeClosed(OutputError):
    """The reader of `--output -` closed the pipe; the run stops there."""

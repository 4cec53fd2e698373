"""The spellings of settings that are not plain numbers, as the CLI and `RunConfig` both take
them: `--max-batch-tokens auto`, `--max-deletes all`, a count or a fraction. Each wrong
spelling is one line that says what to give."""

from __future__ import annotations

import math

from bulkembed.errors import UsageError

AUTO = "auto"


def batch_tokens(text: str | None) -> int | None:
    """`--max-batch-tokens` as a number; None for the default or `auto`.

    >>> batch_tokens("4096"), batch_tokens("auto"), batch_tokens(None)
    (4096, None, None)
    """
    if text is None or text.strip().lower() == AUTO:
        return None
    try:
        return int(text)
    except ValueError:
        raise UsageError(
            f"--max-batch-tokens {text}: expected a number of tokens or auto"
        ) from None


def bad_record_limit(text: str | None) -> float | None:
    """`--max-bad-records` as a count or a fraction; None for no limit.

    >>> bad_record_limit("25"), bad_record_limit("0.01")
    (25, 0.01)
    """
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise UsageError(
            f"--max-bad-records {text}: give a count (25) or a fraction of the records read "
            "below 1 (0.01)"
        ) from None


def delete_limit(text: str) -> float | None:
    """`--max-deletes`: a count (`500`), a fraction below 1 of the previous output's rows
    (`0.25`), or `all` (None: no limit).

    >>> delete_limit("500"), delete_limit("0.25"), delete_limit("all"), delete_limit("-0")
    (500.0, 0.25, None, 0.0)
    """
    if text.strip().lower() == "all":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0 or (value >= 1 and value != int(value)):
        raise UsageError(
            f"--max-deletes {text}: give a count (500), a fraction of the previous output's "
            "rows below 1 (0.25), or all"
        )
    return abs(value)  # `-0` is 0

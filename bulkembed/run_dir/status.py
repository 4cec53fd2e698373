"""`bulkembed status`: where a run directory stands.

`state` is one of `STATES`, for scripts; `message` says the same to a person:

- not-started: the output holds no run directory;
- running: a live run holds the output's lock or lease;
- stopped: unfinished, and no run holds it (interrupted, or killed): run the command again;
- complete: every unit is done (and the last run did not fail);
- failed: the last run ended with an error (`failed.json`, cleared when a run starts), also
  one that found a finished output damaged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bulkembed.config import DEFAULT_RECORDS_PER_UNIT

STATES = ("not-started", "running", "stopped", "complete", "failed")

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord
    from bulkembed.run_dir import RunDirectory
    from bulkembed.sinks import Sink
    from bulkembed.sources import InputFile
    from bulkembed.storage import StorageOptions


def run_status(
    run: RunDirectory, sink: Sink, options: StorageOptions | None = None
) -> dict[str, Any]:
    """Where a run directory stands: its state, units done and pending, documents, bad
    records, lock.
    Units whose rows are gone from `sink` count as pending, whatever the ledger says.
    Inputs on object storage are reached with `options`."""
    from bulkembed.sources import InputFile, unit_names
    from bulkembed.sources.registry import format_name
    from bulkembed.storage import location

    holder = run.lock_holder()
    if not run.config_path.exists():
        if holder:
            return {"output": run.label, "state": "running", "message": f"starting ({holder})"}
        return {
            "output": run.label,
            "state": "not-started",
            "message": f"no run has written here yet ({run.config_path} is missing)",
        }
    config = run.read_config()
    done = run.done_units()
    lost = sink.lost_units(done)
    for part in lost:
        del done[part]
    inputs = config.get("input_paths", [])
    sizes = {i["name"]: i["size"] for i in config.get("fingerprint", {}).get("inputs", [])}
    paths = [(location(i["path"], options), i["name"]) for i in inputs]
    files = [InputFile(p, name, format_name(p) or "", sizes[name]) for p, name in paths]
    failure = run.read_failure()
    if holder:
        state, message = "running", f"running ({holder})"
    elif failure is not None:
        state = "failed"
        message = (
            f"failed with exit status {failure['exit_code']}: {failure['error']}; run the "
            "same command to resume"
        )
    elif run.is_complete(done):
        state, message = "complete", "every unit is done"
    else:
        state, message = "stopped", "unfinished: run the same command to resume"
    pending: int | None = 0
    remaining: int | None = 0
    saved = 0
    if not run.is_complete(done):
        saved = run.saved_documents()
        readable = all(s.path.is_file() for s in files)
        records = config.get("records_per_unit", DEFAULT_RECORDS_PER_UNIT)
        pending = len(set(unit_names(files, records)) - set(done)) if readable else None
        remaining = _remaining(files, done, saved) if readable else None
    settings = ("model", "recipe", "pooling", "normalize", "max_length", "dtype", "device")
    return {
        "output": run.label,
        "state": state,
        "message": message,
        "units_done": len(done),
        "units_pending": pending,
        "docs": sum(r.rows for r in done.values()),
        "docs_saved": saved,
        "docs_remaining": remaining,
        "bad_records": sum(r.bad_records for r in done.values()),
        "truncated": sum(r.truncated + r.carried_truncated for r in done.values()),
        "inputs": len(files),
        "lock": holder,
        **{key: config.get(key) for key in settings},
    }


def _remaining(files: list[InputFile], done: dict[str, UnitRecord], saved: int) -> int | None:
    """Records of `files` neither in a unit done nor saved by an interrupted run (None:
    they cannot be counted)."""
    from bulkembed.errors import BulkembedError
    from bulkembed.sources import count_records

    try:
        total = count_records(files)
    except BulkembedError:
        return None
    return max(0, total - sum(r.rows + r.bad_records for r in done.values()) - saved)

"""`bulkembed status`: where a run directory stands."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bulkembed.config import DEFAULT_RECORDS_PER_UNIT
from bulkembed.errors import OutputError

if TYPE_CHECKING:
    from bulkembed.run_dir import RunDirectory
    from bulkembed.sinks import Sink
    from bulkembed.storage import StorageOptions


def run_status(
    run: RunDirectory, sink: Sink, options: StorageOptions | None = None
) -> dict[str, Any]:
    """Where a run directory stands: units done and pending, documents, bad records, lock.
    Units whose rows are gone from `sink` count as pending, whatever the ledger says.
    Inputs on object storage are reached with `options`."""
    from bulkembed.sources import InputFile, unit_names
    from bulkembed.sources.files import format_name
    from bulkembed.storage import location

    if not run.config_path.exists():
        raise OutputError(f"{run.label} holds no bulkembed run ({run.config_path} is missing)")
    config = run.read_config()
    done = run.done_units()
    lost = sink.lost_units(done)
    for part in lost:
        del done[part]
    inputs = config.get("input_paths", [])
    sizes = {i["name"]: i["size"] for i in config.get("fingerprint", {}).get("inputs", [])}
    paths = [(location(i["path"], options), i["name"]) for i in inputs]
    files = [InputFile(p, name, format_name(p) or "", sizes[name]) for p, name in paths]
    holder = run.lock_holder()
    pending: int | None
    if run.is_complete(done):
        state, pending = "complete", 0
    else:
        readable = all(s.path.is_file() for s in files)
        records = config.get("records_per_unit", DEFAULT_RECORDS_PER_UNIT)
        pending = len(set(unit_names(files, records)) - set(done)) if readable else None
        state = f"running ({holder})" if holder else "stopped: run the same command to resume"
    settings = ("model", "recipe", "pooling", "normalize", "max_length", "dtype", "device")
    return {
        "output": run.label,
        "state": state,
        "units_done": len(done),
        "units_pending": pending,
        "docs": sum(r.rows for r in done.values()),
        "bad_records": sum(r.bad_records for r in done.values()),
        "truncated": sum(r.truncated + r.carried_truncated for r in done.values()),
        "inputs": len(files),
        "lock": holder,
        **{key: config.get(key) for key in settings},
    }

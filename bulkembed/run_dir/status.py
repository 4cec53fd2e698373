"""`bulkembed status`: where a run directory stands.

`state` is one of `STATES`, for scripts, and the command exits with its status
(`exit_status`); `message` says the same to a person:

- missing (66): the output does not exist;
- not-started (66): the output holds no run directory;
- running (75): a live run holds the output's lock or lease;
- stopped (5): unfinished, and no run holds it (interrupted, or killed): run the command
  again;
- complete (0): every unit is done (and the last run did not fail);
- withheld (4, or 3): every unit is done, but the ids gone from the input were not deleted:
  more than `--max-deletes` (or, 3, the run set aside more bad records than
  `--max-bad-records`);
- damaged (65): units marked done whose rows are gone from the output, or a run that found
  the output damaged (a part cut short, a missing configuration);
- failed (1): the last run ended with another error (`failed.json`, cleared when a run
  starts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bulkembed.config import DEFAULT_RECORDS_PER_UNIT
from bulkembed.errors import ExitCode
from bulkembed.run_dir.saved_files import saved_documents
from bulkembed.wording import counted

STATES = (
    "missing",
    "not-started",
    "running",
    "stopped",
    "complete",
    "withheld",
    "damaged",
    "failed",
)
# The exit status of `bulkembed status` for each state (`withheld` by --max-bad-records: 3).
EXIT_STATUS = {
    "missing": 66,
    "not-started": 66,
    "running": int(ExitCode.OUTPUT_LOCKED),
    "stopped": 5,
    "complete": 0,
    "withheld": int(ExitCode.TOO_MANY_DELETES),
    "damaged": 65,
    "failed": int(ExitCode.FAILED),
}

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord
    from bulkembed.run_dir import RunDirectory
    from bulkembed.sinks import Sink
    from bulkembed.sources import InputFile
    from bulkembed.storage import StorageOptions


def exit_status(status: dict[str, Any]) -> int:
    """What `bulkembed status` exits with for `status` (`run_status`)."""
    if status["state"] == "withheld" and status.get("deletes_held_by") == "--max-bad-records":
        return int(ExitCode.TOO_MANY_BAD_RECORDS)
    return EXIT_STATUS[status["state"]]


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
        if not run.output.exists():
            return {
                "output": run.label,
                "state": "missing",
                "message": f"{run.label} does not exist: check the path, or run bulkembed run",
            }
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
    withheld = _withheld(run) if run.is_complete(done) else None
    if holder:
        state, message = "running", f"running ({holder})"
    elif failure is not None:
        state = "damaged" if failure.get("damaged") else "failed"
        message = (
            f"failed with exit status {failure['exit_code']}: {failure['error']}; run the "
            "same command to resume"
        )
    elif lost:
        state = "damaged"
        message = (
            f"{counted(len(lost), 'unit')} marked done but their rows are gone from "
            f"{run.label} ({', '.join(sorted(lost)[:3])}{', ...' if len(lost) > 3 else ''}): "
            "run the same command to embed them again"
        )
    elif withheld is not None:
        state, message = "withheld", withheld
    elif run.is_complete(done):
        state, message = "complete", "every unit is done"
    else:
        state, message = "stopped", "unfinished: run the same command to resume"
    pending: int | None = 0
    remaining: int | None = 0
    saved = 0
    if not run.is_complete(done):
        saved = saved_documents(run.meta, done)
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
        **_deletes(run),
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


def _deletes(run: RunDirectory) -> dict[str, Any]:
    """The last summary's deletes withheld, and the option that withheld them, if any."""
    from bulkembed.errors import BulkembedError
    from bulkembed.run_dir.files import read_json

    if not run.summary_path.exists():
        return {}
    try:
        summary = read_json(run.summary_path)
    except BulkembedError:
        return {}
    if not summary.get("deletes_withheld"):
        return {}
    return {k: summary.get(k) for k in ("deletes_withheld", "deletes_held_by")}


def _withheld(run: RunDirectory) -> str | None:
    """What a finished run that withheld its deletes says (None: it withheld none)."""
    deletes = _deletes(run)
    if not deletes:
        return None
    ids = counted(deletes["deletes_withheld"], "id")
    limit = deletes["deletes_held_by"]
    return (
        f"finished without deleting: {ids} gone from the input kept (over {limit}): check "
        f"the input, or run the same command with a higher {limit}"
    )

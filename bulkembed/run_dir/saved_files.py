"""The files of vectors that interrupted runs saved in a run directory for the next
(`bulkembed.engine.saved` writes and reads them): where they are, and how many documents
they hold for the units not done yet."""

from __future__ import annotations

from collections.abc import Collection

from bulkembed.run_dir.files import SAVED_FILE
from bulkembed.storage import AnyPath


def saved_files(meta: AnyPath) -> list[AnyPath]:
    """The saved files in the run directory `meta`."""
    if not meta.is_dir():
        return []
    return sorted(p for p in meta.iterdir() if SAVED_FILE.fullmatch(p.name))


def saved_documents(meta: AnyPath, done: Collection[str]) -> int:
    """How many documents the saved files of `meta` hold for units not in `done` (a
    document saved twice counts once; a file that cannot be read, none)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    found: set[tuple[int, int]] = set()
    for path in saved_files(meta):
        try:
            table = pq.read_table(
                pa.BufferReader(path.read_bytes()), columns=["_part", "_file", "_position"]
            )
        except (OSError, pa.ArrowException):
            continue
        rows = zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True)
        found.update((file, position) for part, file, position in rows if part not in done)
    return len(found)

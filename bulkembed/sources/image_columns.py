"""A table's column of images (`--image-column`): image bytes (binary), the `datasets`
`Image` feature (a struct of `bytes` and `path`), or paths (strings, relative to the
table's file). Every image travels to the decoding processes as `IMAGE_TYPE`: its bytes,
or the path to read them from (`bulkembed.batching.decode`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bulkembed.sources.columns import cast_misfits
from bulkembed.sources.records import BadRecord, Chunk, InputFile
from bulkembed.sources.validate import problem

if TYPE_CHECKING:
    from bulkembed.sources.base import ReadSettings

# Each image's bytes, or where to read them (a local path or an object-storage URI).
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
# The images of a chunk: each is decoded into about 150 KB at 224 x 224 pixels.
IMAGES_PER_CHUNK = 64


def image_chunk(
    index: int,
    unit: int,
    file: InputFile,
    batch: pa.RecordBatch,
    first_row: int,
    settings: ReadSettings,
) -> Chunk:
    """The records of a table's `batch` (rows from `first_row` on) with their images as
    `IMAGE_TYPE`; a record whose id is not one, or whose image column is of no image type,
    is set aside."""
    column = batch.column(settings.text_column)
    source = str(file.path)
    positions = np.arange(first_row, first_row + batch.num_rows, dtype=np.int64)
    if settings.id_column is None:
        ids = pc.binary_join_element_wise(
            f"{file.name}:", pa.array(positions).cast(pa.string()), ""
        )
    else:
        ids = batch.column(settings.id_column)
    values = ids.to_pylist()
    bad = []
    keep = []
    for offset, doc_id in enumerate(values):
        reason = problem(doc_id, "")
        if reason is not None:
            bad.append(BadRecord(source, reason, doc_id, first_row + offset))
        else:
            keep.append(offset)
    images = _column_images(column, str(file.path.parent))
    if images is None:
        reason = f"image column '{settings.text_column}' holds {column.type}, not images"
        bad += [BadRecord(source, reason, values[i], first_row + i) for i in keep]
        keep = []
    # A passthrough value that does not fit its column's type sets its record aside.
    for name, kind in settings.column_types.items():
        kept = batch.column(name).take(pa.array(keep, pa.int64()))
        misfits = cast_misfits(name, kept, kind)
        bad += [
            BadRecord(source, why, values[keep[i]], first_row + keep[i])
            for i, why in misfits.items()
        ]
        keep = [row for i, row in enumerate(keep) if i not in misfits]
    taken = pa.array(keep, pa.int64())
    chunk = Chunk(
        index,
        unit,
        ids.take(taken).cast(settings.id_type),
        images.take(taken) if images is not None else pa.array([], IMAGE_TYPE),
        False,
        bad,
        positions[keep],
        {name: batch.column(name).take(taken).cast(t) for name, t in settings.column_types.items()},
    )
    return chunk


def image_value(value: Any) -> tuple[dict[str, Any] | None, str | None]:
    """A record's image as an `IMAGE_TYPE` value (None: null, set aside by the decoder), or
    why it is none: bytes, a path, or a `datasets` image (a dict of `bytes` and `path`)."""
    if value is None:
        return None, None
    if isinstance(value, str):
        return {"bytes": None, "path": value}, None
    if isinstance(value, bytes):
        return {"bytes": value, "path": None}, None
    if isinstance(value, dict) and {"bytes", "path"} >= set(value) and value:
        held, path = value.get("bytes"), value.get("path")
        if isinstance(held, (bytes, type(None))) and isinstance(path, (str, type(None))):
            return {"bytes": held, "path": path}, None
    kind = type(value).__name__
    return None, f"image is of type {kind}, not bytes, a path or a datasets Image"


def as_images(chunk: Chunk, file: InputFile) -> Chunk:
    """`chunk` with its contents as `IMAGE_TYPE`, relative paths read from records (JSON
    lines, datasets) resolved against the folder of their `file`."""
    images = _column_images(chunk.texts, str(file.path.parent))
    chunk.texts = images if images is not None else pa.nulls(len(chunk.texts), IMAGE_TYPE)
    return chunk


def _column_images(column: pa.Array, folder: str) -> pa.Array | None:
    """A column of images as `IMAGE_TYPE`, relative paths taken from `folder`; None for a
    column of another type."""
    kind = column.type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return images_of(column.cast(pa.binary()), None)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind):
        return images_of(None, _resolved(column.cast(pa.string()), folder))
    if pa.types.is_struct(kind) and {"bytes", "path"} <= {f.name for f in kind}:
        held = pc.struct_field(column, "bytes").cast(pa.binary())
        paths = _resolved(pc.struct_field(column, "path").cast(pa.string()), folder)
        return images_of(held, paths, column.is_null())
    return None


def _resolved(paths: pa.Array, folder: str) -> pa.Array:
    """`paths`, those relative to nothing (no scheme, not absolute) taken from `folder`
    (a local folder, or a prefix on object storage)."""
    from bulkembed.storage import is_uri

    def resolve(path: str | None) -> str | None:
        if path is None or is_uri(path) or Path(path).is_absolute():
            return path
        if is_uri(folder):
            return f"{folder.rstrip('/')}/{path}"
        return str(Path(folder) / path)

    return pa.array([resolve(p) for p in paths.to_pylist()], pa.string())


def images_of(
    held: pa.Array | None, paths: pa.Array | None, nulls: pa.Array | None = None
) -> pa.Array:
    """An `IMAGE_TYPE` array of images' bytes (`held`) or paths, null where `nulls` is
    true (None: nowhere)."""
    count = len(held) if held is not None else len(paths) if paths is not None else 0
    held = held if held is not None else pa.nulls(count, pa.binary())
    paths = paths if paths is not None else pa.nulls(count, pa.string())
    mask = None if nulls is None else nulls
    return pa.StructArray.from_arrays([held, paths], fields=list(IMAGE_TYPE), mask=mask)

"""The Arrow types of an input's columns: which hold text or ids, and the type of each
passthrough column (`--keep-columns`) over every input."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from bulkembed.errors import InputError

# JSON lines read to infer the Arrow type of a passthrough column.
TYPE_SAMPLE_LINES = 100


def is_text_type(kind: pa.DataType) -> bool:
    """String columns in any Arrow layout; an all-null column reads as type null."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_string_view(kind)
        or pa.types.is_null(kind)
    )


def is_binary_type(kind: pa.DataType) -> bool:
    """Bytes columns, which Spark and older writers use for strings: decoded as UTF-8."""
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or kind == pa.binary_view()


def is_int64_compatible(kind: pa.DataType) -> bool:
    return pa.types.is_signed_integer(kind) or kind in (pa.uint8(), pa.uint16(), pa.uint32())


def passthrough_type(schema: pa.Schema, name: str, source: str) -> pa.DataType:
    if name not in schema.names:
        raise InputError(
            f"--keep-columns '{name}' not found in {source}; columns: {', '.join(schema.names)}"
        )
    return schema.field(name).type


def unify(first: pa.DataType, second: pa.DataType) -> pa.DataType | None:
    if first == second or pa.types.is_null(second):
        return first
    if pa.types.is_null(first):
        return second
    kinds = (first, second)
    if all(pa.types.is_integer(k) for k in kinds):
        return pa.int64()
    if all(pa.types.is_integer(k) or pa.types.is_floating(k) for k in kinds):
        return pa.float64()
    if all(is_text_type(k) and not pa.types.is_null(k) for k in kinds):
        return pa.string()
    return None


def json_type(values: list[Any], name: str, source: str) -> pa.DataType:
    """The Arrow type of a JSON field's first non-null values (those that are valid
    Unicode: the others are bad records)."""
    try:
        return pa.array([v for v in values if encodable(v)]).type
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        raise InputError(
            f"--keep-columns '{name}' mixes values of different types in the first "
            f"{TYPE_SAMPLE_LINES} lines of {source}: make them agree"
        ) from None


def cast_misfits(name: str, values: pa.Array, kind: pa.DataType) -> dict[int, str]:
    """The values of a passthrough column that do not cast to its type (an integer past
    2^53 into float64, say), by index, with the reason."""
    try:
        values.cast(kind)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    else:
        return {}
    misfits = {}
    for i in range(len(values)):
        try:
            values.slice(i, 1).cast(kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            value = values[i].as_py()
            misfits[i] = (
                f"--keep-columns '{name}' holds {value!r:.40}, which does not fit the "
                f"column's type {kind} (the type that holds every input's)"
            )
    return misfits


def encodable(value: Any) -> bool:
    """Whether a JSON value's strings are all valid Unicode (no unpaired surrogate)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def misfit(name: str, value: Any, kind: pa.DataType) -> str | None:
    """Why a passthrough value cannot go into its column, or None if it can."""
    if value is None:
        return None
    if not encodable(value):
        return f"--keep-columns '{name}' holds text with an unpaired surrogate, not valid Unicode"
    try:
        pa.scalar(value, kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        return (
            f"--keep-columns '{name}' holds {type(value).__name__} {value!r:.40}, "
            f"which does not fit the column's type {kind} (from the first records)"
        )
    return None

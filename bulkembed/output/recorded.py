"""The encoder an output was made with, as its run recorded it, so that queries are embedded
with the settings its documents were.

A run records the settings of `bulkembed.load` that shape a vector (`RECORDED`: the model,
its revision and recipe, pooling, normalisation, the documents' prompt, outputs, sparse
top-k, `--dim`, `--dtype-out`, `--quantize`, maximum length) and the exact weights
(`version`) and its query prompt in its `config.json`, under `encoder`, and in the schema
metadata of its parts and tables, under `bulkembed.encoder`. `load(OUTPUT)` reads them
back, with the int8/uint8 ranges of the run, and refuses weights other than the recorded
ones, and a record in `config.json` that is not the one its rows were written with.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bulkembed.config import VECTOR_SETTINGS
from bulkembed.contracts import RUN_DIRECTORY
from bulkembed.errors import OutputError, UsageError
from bulkembed.run_dir import RunDirectory
from bulkembed.run_dir.files import CONFIG_FILE
from bulkembed.schema import ENCODER_KEY
from bulkembed.sinks import parse_output, sink_of

if TYPE_CHECKING:
    from bulkembed.models.model_spec import ModelSpec
    from bulkembed.output.format import OutputFormat
    from bulkembed.sinks import OutputTarget
    from bulkembed.storage import StorageOptions

# The settings of `load` a run records: the model, and what shapes its vectors.
RECORDED = ("model", *VECTOR_SETTINGS)


def encoder_record(spec: ModelSpec, output_format: OutputFormat) -> dict[str, Any]:
    """What a run records of its encoder: `RECORDED`, the exact weights (`version`), and
    the prompt its model puts before queries (`query_prompt`)."""
    dense = spec.family == "dense"
    return {
        "model": spec.source,
        "revision": spec.revision,
        "recipe": spec.recipe,
        # Settings of a dense model; other families pool and normalize in their own way.
        "pooling": spec.pooling.value if spec.pooling and dense else None,
        "normalize": spec.normalize if dense else None,
        "prompt": spec.prompt,
        "outputs": list(spec.outputs),
        "sparse_top_k": spec.sparse_top_k,
        "dim": output_format.dim,
        "dtype_out": output_format.dtype_out,
        "quantize": output_format.quantize,
        "max_length": spec.max_length,
        "version": spec.version,
        "query_prompt": spec.query_prompt,
    }


@dataclass(frozen=True, slots=True)
class OutputEncoder:
    """The encoder of the output `label`: its record (`encoder_record`) and the int8/uint8
    ranges its vectors were quantized with."""

    label: str
    record: dict[str, Any]
    ranges: list[list[float]] | None


def names_output(source: str | os.PathLike[str]) -> bool:
    """Whether `source` names an output rather than a model: a URI (`lancedb://`, `s3://`,
    ...: a model is a recipe, a hub id or a local folder), or a folder with a run
    directory."""
    text = os.fspath(source)
    return "://" in text or (Path(text) / RUN_DIRECTORY / CONFIG_FILE).is_file()


def output_encoder(output: str, options: StorageOptions | None = None) -> OutputEncoder:
    """The recorded encoder of `output`, or a one-line error saying why there is none."""
    target = parse_output(output, options)
    if target.run_directory is None:
        raise UsageError(f"{output} is a stream: it keeps no record of its encoder")
    run = RunDirectory.for_target(target, None)
    if not run.config_path.exists():
        raise UsageError(
            f"{target.label} holds no bulkembed run ({run.config_path} is missing): pass a "
            "model, or an output that bulkembed wrote"
        )
    found = run.read_config().get("encoder")
    if not isinstance(found, dict) or not set(RECORDED) <= set(found):
        raise UsageError(
            f"{target.label} was written by an earlier bulkembed, which did not record its "
            "encoder: load the model by name with the settings of that run"
        )
    _check_rows_record(target, run, found)
    quantized = found.get("quantize") in ("int8", "uint8")
    ranges = run.read_quantization_ranges() if quantized else None
    if quantized and ranges is None:
        raise UsageError(
            f"{target.label}: {run.quantization_path} is missing, so its int8/uint8 scale "
            "is unknown: restore it"
        )
    return OutputEncoder(target.label, found, ranges)


def _check_rows_record(target: OutputTarget, run: RunDirectory, found: dict[str, Any]) -> None:
    """Refuse a `config.json` whose encoder record is not the one in the schema its rows
    were written with (a done unit's part, the table), in one line that names the first
    setting that differs: an edited record would rebuild an encoder its vectors do not
    come from."""
    done = [r.part for r in run.done_units().values() if r.rows]
    schema = sink_of(target).part_schema(done[0]) if done else None
    written = (schema.metadata or {}).get(ENCODER_KEY.encode()) if schema is not None else None
    if written is None:
        return
    rows = json.loads(written)
    differing = sorted(k for k in set(rows) | set(found) if rows.get(k) != found.get(k))
    if differing:
        key = differing[0]
        raise OutputError(
            f"{target.label}: {run.config_path} records the encoder's {key} as "
            f"{found.get(key)!r}, its rows were written with {rows.get(key)!r}: the record "
            f"was edited or damaged; restore {CONFIG_FILE} (its `encoder` is the "
            f"{ENCODER_KEY} of the rows' schema), or embed the corpus again"
        )

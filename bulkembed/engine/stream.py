"""The unit loop both engines share: tokenized chunks of one unit or many, in input order,
gathered into windows, embedded on a `DeviceSession` (settled first where `--dtype auto`
awaits its check), put in the output's format (`CalibratingFormat`, with the ranges of an
earlier run: `resumed_output_format`) and handed to a part writer. The local engine
streams every pending unit through it; a Ray actor runs it on one unit at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from bulkembed.batching.windows import embed_packed, window_tokens, windows
from bulkembed.contracts import DeviceCounts, Embeddings
from bulkembed.engine.session import DeviceSession, Unsettled
from bulkembed.engine.writer import PartWriter, write_window
from bulkembed.errors import OutputError
from bulkembed.output.recorded import encoder_record
from bulkembed.schema import ENCODER_KEY, output_schema
from bulkembed.version import __version__

if TYPE_CHECKING:
    import pyarrow as pa

    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.contracts import UnitRecord
    from bulkembed.encoders import VectorSizes
    from bulkembed.models.model_spec import ModelSpec
    from bulkembed.output.format import OutputFormat
    from bulkembed.reporting.progress import Reporter, RunStats
    from bulkembed.run_dir import RunDirectory
    from bulkembed.sources import RecordReader


class CalibratingFormat:
    """Embeddings as the output stores them; int8/uint8 ranges are calibrated on the first
    window and stored in the run directory before any part is written."""

    def __init__(self, output_format: OutputFormat, run: RunDirectory) -> None:
        self.output_format = output_format
        self.run = run

    def __call__(self, embedded: Embeddings) -> Embeddings:
        if self.output_format.needs_ranges and embedded.dense is not None:
            calibrated = self.output_format.calibrated(embedded.dense)
            assert calibrated.ranges is not None and calibrated.quantize is not None
            self.run.write_quantization_ranges(calibrated.quantize, calibrated.ranges.tolist())
            self.output_format = calibrated
        return self.output_format.apply(embedded)


def resumed_output_format(
    output_format: OutputFormat, run: RunDirectory, done: dict[str, UnitRecord]
) -> OutputFormat:
    """The run's output format, with the int8/uint8 ranges of an earlier run if any."""
    ranges = run.read_quantization_ranges()
    if output_format.quantize in ("int8", "uint8") and ranges is None and done:
        raise OutputError(
            f"{run.quantization_path} is missing but units are done with its ranges: "
            "restore it, or use --overwrite"
        )
    if ranges is None:
        return output_format
    return replace(output_format, ranges=np.asarray(ranges, dtype=np.float32))


@dataclass(frozen=True, slots=True)
class EmbeddedWindow:
    """A window's chunks, their documents' vectors as the output stores them (input order),
    and the length each document was padded to."""

    chunks: list[TokenizedChunk]
    vectors: Embeddings
    padded: np.ndarray

    def write(self, writer: PartWriter) -> Iterator[None]:
        """Write the window chunk by chunk, yielding after each (see `write_window`)."""
        return write_window(writer, self.chunks, self.vectors, self.padded)


@dataclass(frozen=True, slots=True)
class PartlyEmbedded:
    """A window embedded in part (the run was asked to stop): the documents embedded
    (`rows`, positions among the window's documents) and their vectors, as the model gave
    them."""

    chunks: list[TokenizedChunk]
    rows: np.ndarray
    vectors: Embeddings


def part_schema(
    reader: RecordReader, spec: ModelSpec, sizes: VectorSizes, output_format: OutputFormat
) -> pa.Schema:
    """The output's schema: the id type and passthrough columns that `reader` found, and
    the columns of the vectors the model gives (`sizes`), in `output_format`."""
    assert reader.id_type is not None
    dense, multivector = sizes.dense_dim, sizes.multivector_dim
    return output_schema(
        reader.id_type,
        dense=None if dense is None else output_format.dense_type(dense),
        sparse="sparse" in spec.outputs,
        multivector=None if multivector is None else output_format.multivector_type(multivector),
        passthrough=reader.column_types,
        metadata=schema_metadata(spec, sizes, output_format),
    )


def schema_metadata(
    spec: ModelSpec, sizes: VectorSizes, output_format: OutputFormat
) -> dict[str, str]:
    """What a reader of a part needs to know to search it, as `bulkembed.`-prefixed string
    keys of the schema metadata: the model, the exact weights (`revision`: the hub commit or
    a digest of a local folder), the outputs, the dense dimension ("" without dense), whether
    vectors are normalised, the dense vectors' metric, the bulkembed version, and the
    settings of its encoder (`recorded`). The same for every part of a run, since its
    settings are.

    The metric follows what the vectors are: `cosine` for normalised vectors (the dot
    product gives the same order), `dot` for vectors the model leaves unnormalised (and for
    sparse weights), `hamming` for `--quantize binary/ubinary` bits."""
    if output_format.quantize in ("binary", "ubinary"):
        metric = "hamming"
    else:
        metric = "cosine" if output_format.normalize and sizes.dense_dim is not None else "dot"
    if sizes.dense_dim is None and sizes.multivector_dim is not None:
        metric = "cosine"  # multi-vectors are normalised; MaxSim sums their cosines
    return {
        "bulkembed.model": spec.source,
        "bulkembed.revision": spec.version,
        "bulkembed.outputs": ",".join(spec.outputs),
        "bulkembed.dimension": "" if sizes.dense_dim is None else str(sizes.dense_dim),
        "bulkembed.normalized": str(output_format.normalize).lower(),
        "bulkembed.metric": metric,
        "bulkembed.version": __version__,
        ENCODER_KEY: json.dumps(encoder_record(spec, output_format)),
    }


def _tokenizer_seconds(
    tokenized: Iterator[TokenizedChunk], stats: RunStats
) -> Iterator[TokenizedChunk]:
    """`tokenized`, adding each chunk's tokenizer seconds to the tokenize stage."""
    for chunk in tokenized:
        stats.stages["tokenize"] += chunk.seconds
        yield chunk


def gather_windows(
    tokenized: Iterator[TokenizedChunk],
    sizes: VectorSizes,
    budget: int,
    stats: RunStats,
    per_unit: bool = False,
) -> Iterator[list[TokenizedChunk]]:
    """`tokenized` gathered into windows (`windows`; `per_unit`: ending at every unit's
    end) for batches of `budget` tokens of a model that gives vectors of `sizes`; each
    chunk's tokenizer seconds count into `stats`."""
    size = window_tokens(budget, sizes.multivector_dim)
    return windows(_tokenizer_seconds(tokenized, stats), size, per_unit)


def embed_windows(
    gathered: Iterator[list[TokenizedChunk]],
    session: DeviceSession | Unsettled,
    formatted: Callable[[Embeddings], Embeddings],
    write: Callable[[EmbeddedWindow], None],
    stats: RunStats,
    reporter: Reporter,
    settled: Callable[[DeviceSession], None],
    stopping: Callable[[], bool] = lambda: False,
) -> list[PartlyEmbedded]:
    """Embed the windows `gathered` on `session`, and `write` each window's vectors as
    `formatted` makes them, in input order; count into `stats` (what the devices counted
    too: `DeviceCounts`). An `Unsettled` session is settled by the first window with a
    document (`Unsettled.settle`); the session it becomes is handed to `settled` at once,
    to take its place for the next call, and to be closed. Once `stopping()` says so, the
    batches in flight finish and the windows they leave embedded in part are returned."""

    def emit(window: list[TokenizedChunk], embedded: Embeddings, padded: np.ndarray) -> None:
        with stats.timed("post-process"):
            vectors = formatted(embedded)
        write(EmbeddedWindow(window, vectors, padded))
        for chunk in window:
            carried = chunk.chunk.carried
            if carried is not None:
                saved = int(carried.saved_rows.sum())
                stats.saved += saved
                stats.carried += len(carried.records.positions) - saved
        reporter.update(stats)

    # The dtype is settled on the first window with a document, before any batch runs (the
    # check may change the embedder and its budget); windows before it have nothing to
    # embed and are written as they come. The check's sample is that window's head.
    counted = stats.counts.copy()
    began: list[DeviceCounts] = []

    def begin() -> None:
        # A check recorded before replays on the run's first batch: counted from here.
        stats.begin_embedding()
        began.append(session.counts)

    first = []
    sample = None
    while isinstance(session, Unsettled) and (window := next(gathered, None)) is not None:
        found = session.settle(window, begin)
        if found is None:
            emit(window, Embeddings(), np.empty(0, dtype=np.int64))
            continue
        first.append(window)
        session, sample = found.session, found.sample
        settled(session)
    # A check made now ran before the first batch (both dtypes, the budget's probe): the
    # device seconds counted are those of the batches from here on.
    before = began[0] if began else session.counts
    packed_windows = embed_packed(
        chain(first, gathered),
        session.embedder,
        session.budget,
        stats,
        reporter,
        sample,
        stopping,
    )
    unfinished = []
    for packed in packed_windows:
        stats.counts = counted.copy()
        stats.counts.add(session.counts.since(before))
        if not packed.complete:
            rows, embedded = packed.embedded_so_far()
            if len(rows):
                unfinished.append(PartlyEmbedded(packed.chunks, rows, embedded))
            continue
        with stats.timed("post-process"):
            embedded, padded = packed.embedded()
        emit(packed.chunks, embedded, padded)
    return unfinished

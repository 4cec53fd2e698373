"""`embed_corpus`: read, tokenize, batch, embed and write a corpus. Orchestration only.

Records stream from the shards (units already done are skipped), lose repeated ids, stop at
`--limit`, and go to tokenizer processes that run ahead of the model on a bounded queue.
Tokenized chunks gather into a window of about `WINDOW_BATCHES` batches' worth of tokens;
the window is sorted by length, packed into token-budget batches, embedded, put back in input
order and written part by part. When a unit's last chunk is written its part is committed,
then marked done in the ledger.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bulkembed import __version__
from bulkembed.checkpoint import RunDirectory, UnitRecord
from bulkembed.config import (
    DType,
    Engine,
    OnBadRecord,
    RunConfig,
    ShardSpec,
    default_tokenize_workers,
)
from bulkembed.encoders import Embeddings, Encoder
from bulkembed.errors import BulkembedError, InputError, Interrupted, OutputError
from bulkembed.incremental import PreviousOutput, hash_contents
from bulkembed.outputs import OutputFormat
from bulkembed.precision import PrecisionCheck, check_on_window
from bulkembed.progress import Reporter, RunStats
from bulkembed.schema import output_schema
from bulkembed.sinks import (
    IndexSettings,
    LanceSink,
    OutputTarget,
    ParquetSink,
    Sink,
    StreamFormat,
    StreamSink,
    parse_output,
)
from bulkembed.sources import (
    Chunk,
    RecordReader,
    SeenIds,
    Shard,
    count_records,
    drop_duplicate_ids,
    list_shards,
    take,
)
from bulkembed.summary import fingerprint, summarize
from bulkembed.tokenize import TokenizedChunk, TokenizerPool, TokenizerSettings
from bulkembed.units import SkippedUnits, counted_units, shard_parts
from bulkembed.windows import embed_window, window_tokens, windows
from bulkembed.writer import PartWriter, WriteBehind, write_window

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

    from bulkembed.encoder_pool import EncoderPool
    from bulkembed.model_spec import ModelSpec


def _describe_outputs(spec: ModelSpec, encoder: Encoder) -> str:
    parts = []
    if encoder.dense_dim is not None:
        pooling = spec.pooling.value if spec.pooling else "cls"
        parts.append(f"dense {encoder.dense_dim}-d ({pooling} pooling)")
    if "sparse" in spec.outputs:
        parts.append("sparse")
    if encoder.multivector_dim is not None:
        parts.append(f"multivector {encoder.multivector_dim}-d")
    return ", ".join(parts)


def run_schema(
    reader: RecordReader,
    spec: ModelSpec,
    encoder: Encoder | EncoderPool,
    output_format: OutputFormat,
) -> pa.Schema:
    """The output's schema: the id type and passthrough columns that `reader` found, and
    the columns of what `encoder` produces, in `output_format`."""
    assert reader.id_type is not None
    dense, multivector = encoder.dense_dim, encoder.multivector_dim
    return output_schema(
        reader.id_type,
        dense=None if dense is None else output_format.dense_type(dense),
        sparse="sparse" in spec.outputs,
        multivector=None if multivector is None else output_format.multivector_type(multivector),
        passthrough=reader.column_types,
    )


def _write_vocabulary(run: RunDirectory, spec: ModelSpec) -> None:
    """`vocab.json`, id -> token, so that loaders can turn sparse indices into terms."""
    from tokenizers import Tokenizer

    vocabulary = Tokenizer.from_str(spec.tokenizer_json).get_vocab(with_added_tokens=True)
    run.write_vocabulary(
        {str(i): token for token, i in sorted(vocabulary.items(), key=lambda x: x[1])}
    )


def fail_on_bad_records(chunks: Iterable[Chunk]) -> Iterator[Chunk]:
    for chunk in chunks:
        if chunk.bad:
            bad = chunk.bad[0]
            raise InputError(
                f"bad record at {bad.where()}: {bad.reason} "
                "(--on-bad-record skip sets such records aside and goes on)"
            )
        yield chunk


def _start_counting(shards: list[Shard], limit: int | None, reporter: Reporter) -> None:
    """Count the documents in the background, for the progress bar's total and ETA."""

    def count() -> None:
        total = count_records(shards)
        reporter.set_total(min(total, limit) if limit is not None else total)

    threading.Thread(target=count, name="bulkembed-count", daemon=True).start()


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into `Interrupted`, so that cleanup runs and the lock drops."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signal_number: int, frame: object) -> None:
        name = signal.Signals(signal_number).name
        raise Interrupted(
            signal_number,
            f"stopped by {name}: committed parts are kept; run the same command again to resume",
        )

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _committed_ids(sink: Sink, done: dict[str, UnitRecord]) -> SeenIds:
    seen = SeenIds()
    for doc_id in sink.committed_ids(done):
        seen.add(doc_id)
    return seen


@dataclass
class _Job:
    """One `bulkembed run`, resolved: what to read, with which model, where to write."""

    config: RunConfig
    spec: ModelSpec
    devices: list[str]
    dtype: torch.dtype
    shards: list[Shard]
    reader: RecordReader
    output_format: OutputFormat
    target: OutputTarget
    sink: Sink
    run: RunDirectory
    reporter: Reporter
    workers: int
    check_dtype: bool = False
    previous: PreviousOutput | None = None
    precision: PrecisionCheck | None = None
    tuned: bool = False
    # Every unit of the inputs, counted once up front for `--shard` and `--engine ray`,
    # and this run's share of them with `--shard`.
    units: list[str] | None = None
    parts: frozenset[str] | None = None
    # The dtypes a Ray run's actors computed in (each checks `--dtype auto` for itself).
    computed_in: list[str] | None = None

    def run_info(self) -> dict[str, Any]:
        return {
            "model": self.spec.source,
            "recipe": self.spec.recipe,
            "device": ",".join(self.devices),
            "dtype": ",".join(self.computed_in or [str(self.dtype).removeprefix("torch.")]),
            "outputs": ",".join(self.spec.outputs),
            "pooling": self.spec.pooling.value if self.spec.pooling else None,
            "normalize": self.spec.normalize,
            "max_length": self.spec.max_length,
            "max_batch_tokens": self.spec.max_batch_tokens,
            "tokenize_workers": self.workers,
            "output": self.target.label,
            "dtype_check": None if self.precision is None else self.precision.describe(),
            "shard": None if self.config.shard is None else self.config.shard.label,
        }

    def settings(self) -> TokenizerSettings:
        spec = self.spec
        return TokenizerSettings(
            spec.tokenizer_json, spec.max_length, spec.prompt, spec.lowercase, spec.prefix_token_id
        )

    def _chunks(self, done: dict[str, UnitRecord]) -> Iterator[Chunk]:
        """The records still to embed: pending units, first id wins, up to the limit."""
        config = self.config
        self.reader.done = SkippedUnits(done, self.parts)
        chunks: Iterator[Chunk] = iter(self.reader)
        mine = {k: v for k, v in done.items() if self.parts is None or k in self.parts}
        chunks = drop_duplicate_ids(chunks, _committed_ids(self.sink, mine), self.shards)
        if config.limit is not None:
            chunks = take(chunks, config.limit - sum(r.rows for r in done.values()))
        if config.on_bad_record is OnBadRecord.FAIL:
            chunks = fail_on_bad_records(chunks)
        chunks = hash_contents(chunks, self.settings())
        if self.previous is not None:
            chunks = self.previous.carry_over(chunks)
        return chunks

    def _output_format(self, done: dict[str, UnitRecord]) -> OutputFormat:
        """The run's output format, with the int8/uint8 ranges of an earlier run if any."""
        ranges = self.run.read_quantization_ranges()
        if self.output_format.quantize in ("int8", "uint8") and ranges is None and done:
            raise OutputError(
                f"{self.run.quantization_path} is missing but units are done with its ranges: "
                "restore it, or use --overwrite"
            )
        if ranges is None:
            return self.output_format
        return replace(self.output_format, ranges=np.asarray(ranges, dtype=np.float32))

    def _calibrate(self, output_format: OutputFormat, dense: np.ndarray) -> OutputFormat:
        """int8/uint8 ranges from the first window, stored before any part is written."""
        calibrated = output_format.calibrated(dense)
        assert calibrated.ranges is not None and calibrated.quantize is not None
        self.run.write_quantization_ranges(calibrated.quantize, calibrated.ranges.tolist())
        return calibrated

    def _choose_precision(
        self, reference: Encoder, window: list[TokenizedChunk]
    ) -> Encoder | EncoderPool:
        """Embed the window's first documents in float32 (`reference`) and in the fast
        dtype; keep the fast dtype only if they agree. With several devices the check runs
        here on the first one, and the workers start afterwards in the dtype chosen. A
        window with no document to embed leaves the choice to the next one."""
        import torch

        checked = check_on_window(reference, window, self.dtype, self.spec.max_batch_tokens)
        if checked is None:
            return reference
        encoder, self.precision = checked
        self.reporter.info(f"--dtype auto: {self.precision.describe()}")
        if not self.precision.passed:
            self.dtype = torch.float32
        if len(self.devices) > 1:
            del reference, encoder, checked
            if self.devices[0].startswith("cuda"):
                torch.cuda.empty_cache()
            return self._start_pool()
        return encoder

    def _start_pool(self) -> EncoderPool:
        """One encoder process per device, in the run's dtype."""
        from bulkembed.devices import cpu_threads_per_worker
        from bulkembed.encoder_pool import EncoderPool

        dtype_name = str(self.dtype).removeprefix("torch.")
        threads = cpu_threads_per_worker(self.devices)
        tune = self.config.tune_batch_tokens
        pool = EncoderPool(self.spec, self.devices, dtype_name, threads, tune)
        if pool.batch_tokens is not None:
            self._use_batch_tokens(pool.batch_tokens)
        return pool

    def _start_encoder(self) -> Encoder | EncoderPool:
        """The encoder: in this process on one device, else a pool of worker processes.
        While a `--dtype auto` choice awaits its check, a float32 encoder in this process
        on the first device, which also gives the output's sizes."""
        import torch

        from bulkembed.encoders import build_encoder

        if len(self.devices) > 1 and not self.check_dtype:
            return self._start_pool()
        dtype = torch.float32 if self.check_dtype else self.dtype
        encoder = build_encoder(self.spec, self.devices[0], dtype)
        if self.config.tune_batch_tokens:
            tuned = encoder.tune_batch_tokens()
            if tuned is not None:
                self._use_batch_tokens(tuned)
        return encoder

    def _use_batch_tokens(self, budget: int) -> None:
        """Batch by `budget` tokens from now on (`--max-batch-tokens auto`); it only ever
        shrinks, so that batches packed before still fit."""
        if self.tuned:
            budget = min(budget, self.spec.max_batch_tokens)
        self.tuned = True
        self.spec = replace(self.spec, max_batch_tokens=budget)
        self.reporter.info(f"--max-batch-tokens auto: {budget} tokens per batch")

    def embed_pending(self, done: dict[str, UnitRecord]) -> RunStats:
        """Embed every unit not in `done`; mark the run complete when all are."""
        from bulkembed.devices import keep_memory_flat
        from bulkembed.encoder_pool import EncoderPool

        keep_memory_flat()
        encoder = self._start_encoder()
        spec, reporter = self.spec, self.reporter
        budget = spec.max_batch_tokens
        reporter.info(
            f"{spec.source} on {', '.join(self.devices)} ({self.run_info()['dtype']}): "
            f"{_describe_outputs(spec, encoder)}; max length {spec.max_length}; "
            f"batches of {budget} "
            f"tokens = {max(1, budget // spec.max_length)} docs at max length; "
            f"{self.workers} tokenizer process(es); {len(self.shards)} shard(s)"
            + (f"; resuming after {len(done)} done unit(s)" if done else "")
            + (
                f"; reusing the vectors of {self.previous.rows:,} document(s) in "
                f"{self.previous.path} where the text is unchanged"
                if self.previous is not None
                else ""
            )
        )
        stats = RunStats()
        assert self.reader.id_type is not None
        output_format = self._output_format(done)
        schema = run_schema(self.reader, spec, encoder, output_format)
        writer = PartWriter(self.run, self.sink, schema)

        def write(
            embedded_window: tuple[list[TokenizedChunk], Embeddings, np.ndarray],
        ) -> Iterator[None]:
            return write_window(writer, *embedded_window)

        settings = self.settings()
        reporter.start(stats)
        if self.parts is None:
            _start_counting(self.shards, self.config.limit, reporter)
        try:
            with TokenizerPool(settings, self.workers) as pool, WriteBehind(write) as behind:
                size = window_tokens(budget, encoder.multivector_dim)
                for window in windows(pool.map(self._chunks(done)), size):
                    if self.check_dtype and self.precision is None:
                        encoder = self._choose_precision(encoder, window)
                    budget = self.spec.max_batch_tokens
                    embedded, padded = embed_window(window, encoder, budget, stats, reporter)
                    if output_format.needs_ranges and embedded.dense is not None:
                        output_format = self._calibrate(output_format, embedded.dense)
                    behind.submit((window, output_format.apply(embedded), padded))
                    carried = [c.chunk.carried for c in window if c.chunk.carried is not None]
                    stats.carried += sum(len(c.records.positions) for c in carried)
                    reporter.update(stats)
                behind.finish()
            self.sink.finish()
        finally:
            writer.close()
            reporter.close()
            if isinstance(encoder, EncoderPool):
                encoder.close()
        self.mark_complete_if_whole()
        return stats

    def mark_complete_if_whole(self) -> None:
        """Mark the output complete once every unit is done: at once for a whole run; for
        a `--shard` run, when the other shards' units are done too."""
        done = self.run.done_units()
        if self.parts is not None:
            assert self.units is not None
            pending = [u for u in self.units if u not in done]
            if pending:
                self.reporter.info(
                    f"shard {self.config.shard.label} is done; {len(pending)} unit(s) of other "
                    "shards are pending"
                )
                return
        self.run.mark_complete(len(done))


def embed_corpus(config: RunConfig, reporter: Reporter | None = None) -> dict[str, Any]:
    """Embed every document of `config.inputs` into `config.output`; return the summary.

    An output that holds an unfinished run with the same settings is resumed; a finished
    one is left as it is."""
    with _stop_on_signals():
        job = _prepare(config, reporter or Reporter())
        try:
            summary = _run(job)
        finally:
            if not job.sink.resumable:
                shutil.rmtree(job.run.meta, ignore_errors=True)
    job.reporter.finish(summary)
    return summary


def _run(job: _Job) -> dict[str, Any]:
    """Open the run directory, embed what is pending, write the summary."""
    config = job.config
    settings = fingerprint(config, job.spec, job.shards)
    run_info = job.run_info()
    done = job.run.open(settings, config.overwrite, job.sink, job.parts)
    for repair in job.run.repairs:
        job.reporter.warn(repair)
    try:
        complete = job.run.is_complete()
        previous_rows = None
        if config.since is not None and complete:
            previous_rows = job.run.read_config().get("previous_rows")
        elif config.since is not None:
            job.previous = PreviousOutput(Path(config.since), settings)
            previous_rows = job.previous.rows
            _share_quantization(job)
        spec_fields = {k: v for k, v in asdict(job.spec).items() if k != "tokenizer_json"}
        paths = [{"name": s.name, "path": str(s.path)} for s in job.shards]
        job.run.write_config(
            {
                "version": __version__,
                "fingerprint": settings,
                "input_paths": paths,
                "model": spec_fields,
                "previous_rows": previous_rows,
                **run_info,
            }
        )
        if "sparse" in job.spec.outputs:
            _write_vocabulary(job.run, job.spec)
        limited = config.limit is not None
        if complete:
            job.reporter.info(f"nothing to do: {job.target.label} already holds every document")
            return summarize(done, RunStats(), run_info, previous_rows, limited)
        if config.engine is Engine.RAY:
            from bulkembed.ray_engine import embed_on_ray

            stats = embed_on_ray(job, done)
        else:
            stats = job.embed_pending(done)
        done = job.run.done_units()
        # Lines a unit written twice (a lost Ray actor's) appended twice go.
        job.run.rebuild_quarantine(done, job.parts)
        summary = summarize(done, stats, job.run_info(), previous_rows, limited)
        job.run.write_summary(summary)
        return summary
    finally:
        if not job.sink.resumable:
            _report_bad_records(job)
        job.run.release_lock()


def _share_quantization(job: _Job) -> None:
    """Carried-over rows keep the previous output's int8/uint8 scale: so must new ones."""
    quantize = job.output_format.quantize
    if quantize not in ("int8", "uint8") or job.run.read_quantization_ranges() is not None:
        return
    assert job.previous is not None and quantize is not None
    ranges = RunDirectory(job.previous.path).read_quantization_ranges()
    if ranges is None:
        raise OutputError(
            f"--since {job.previous.path}: its _bulkembed/quantization.json is missing, so its "
            "int8/uint8 vectors cannot be matched; restore it, or run without --since"
        )
    job.run.write_quantization_ranges(quantize, ranges)


def _report_bad_records(job: _Job) -> None:
    """A stream keeps no run directory: its bad records go to stderr, one JSON line each."""
    if job.run.bad_records_path.exists():
        for line in job.run.bad_records_path.read_text(encoding="utf-8").splitlines():
            job.reporter.info(f"bad record: {line}")


def _make_sink(config: RunConfig, target: OutputTarget, normalize: bool) -> Sink:
    if target.kind == "stdout":
        stream_format = StreamFormat(config.stream_format or StreamFormat.JSONL.value)
        # A buffered writer of its own: `sys.stdout.buffer` is a raw file when Python runs
        # unbuffered, and a raw write may take only part of what it is given.
        stdout = open(sys.stdout.fileno(), "wb", closefd=False)  # noqa: SIM115 (process-long)
        return StreamSink(stdout, stream_format)
    assert target.path is not None
    if target.kind == "lancedb":
        index = None
        if config.index:
            metric = "cosine" if normalize else "dot"
            index = IndexSettings(config.index_type, config.index_partitions, metric)
        fts = config.text_column if config.fts else None
        return LanceSink(target.path, target.table or "", index, fts)
    return ParquetSink(target.path)


def _run_directory(target: OutputTarget, shard: ShardSpec | None) -> RunDirectory:
    """The run's bookkeeping; a stream's lives in a temporary directory, removed at the end."""
    meta = target.run_directory
    if meta is None:
        meta = Path(tempfile.mkdtemp(prefix="bulkembed-stream-"))
    return RunDirectory(target.path or meta, meta=meta, label=target.label, shard=shard)


def _prepare(config: RunConfig, reporter: Reporter) -> _Job:
    """Find the inputs and check their columns, resolve the model and the device."""
    from bulkembed.devices import resolve_devices, resolve_dtype
    from bulkembed.model_spec import resolve_model

    target = parse_output(config.output)
    since = Path(config.since).resolve() if config.since is not None else None
    if since is not None and target.path is not None and since == target.path.resolve():
        raise BulkembedError("--since must name another output than --output")
    skipped: list[str] = []
    shards = list_shards(config.inputs, exclude=target.path, skipped=skipped)
    for directory in skipped:
        reporter.warn(f"input directory {directory} cannot be read: its files are left out")
    reader = RecordReader(
        shards,
        config.text_column,
        config.id_column,
        lines_per_unit=config.records_per_unit,
        keep_columns=config.keep_columns,
    )
    reader.check()
    spec = resolve_model(config)
    workers = config.tokenize_workers
    if config.engine is Engine.RAY:
        # The cluster's devices, not this machine's: the Ray engine resolves both there.
        devices, dtype, check_dtype = [config.devices], resolve_dtype(DType.FLOAT32, "cpu"), False
    else:
        devices = resolve_devices(config.devices)
        dtype = resolve_dtype(config.dtype, devices[0])
        check_dtype = config.dtype is DType.AUTO and str(dtype) != "torch.float32"
    distributed = config.shard is not None or config.engine is Engine.RAY
    units = counted_units(shards, config.records_per_unit) if distributed else None
    return _Job(
        config=config,
        spec=spec,
        devices=devices,
        dtype=dtype,
        check_dtype=check_dtype,
        shards=shards,
        reader=reader,
        output_format=OutputFormat.for_run(config, spec),
        target=target,
        sink=_make_sink(config, target, spec.normalize),
        run=_run_directory(target, config.shard),
        reporter=reporter,
        workers=default_tokenize_workers(devices[0]) if workers is None else workers,
        units=units,
        parts=None if units is None or config.shard is None else shard_parts(units, config.shard),
    )

"""`--engine ray`: the same run on a Ray cluster, through Ray Data.

This process (the driver) opens the run directory as a local run does, lists the units of
work still pending and hands them to Ray Data, one row per unit. CPU tasks read a unit and
tokenize it; an actor pool, one actor per GPU (or CPU actors with a thread count each),
packs the unit's documents into token-budget batches, embeds them and commits the unit into
the shared output exactly as a local run's writer does: a Parquet part under a temporary
name, renamed (on object storage: uploaded whole under its name), or a LanceDB table's
fragments appended in one commit beside the other actors' (`bulkembed.sinks.lance`); then
its done-marker. The driver counts what comes back, and writes the summary.

A unit is committed at once, then marked, and its part's name is fixed by the inputs, so a
run killed at any point resumes like a local one, and a unit that Ray runs again after an
actor died is written whole again under the same name, once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pickle
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bulkembed.batching.admission import (
    drop_duplicate_ids,
    fail_on_bad_records,
    leave_id_hashes,
    set_aside,
)
from bulkembed.batching.decode import ImageSettings
from bulkembed.batching.packing import BatchPolicy
from bulkembed.batching.tokenize import TokenizedChunk, TokenizerPool, TokenizerSettings
from bulkembed.config import DType, OnBadRecord, ShardSpec
from bulkembed.contracts import UnitRecord, part_unit
from bulkembed.engine.modes import RunMode, UpsertSinks, part_writer
from bulkembed.engine.plan import RunOutcome, RunPlan
from bulkembed.engine.precision import PrecisionCheck
from bulkembed.engine.ray_cluster import actors as pool_actors
from bulkembed.engine.ray_cluster import connect
from bulkembed.engine.session import DeviceSession, Unsettled, start_session
from bulkembed.engine.stream import (
    EmbeddedWindow,
    embed_windows,
    gather_windows,
    part_schema,
)
from bulkembed.errors import BulkembedError
from bulkembed.incremental.carry import CarryOver
from bulkembed.incremental.lookup import PreviousLookup
from bulkembed.output.format import OutputFormat
from bulkembed.reporting.progress import QuietReporter, Reporter, RunStats
from bulkembed.run_dir import RunDirectory
from bulkembed.sources import IdKey, RecordReader, SeenIds
from bulkembed.storage import AnyPath
from bulkembed.wording import counted

if TYPE_CHECKING:
    from bulkembed.models.model_spec import ModelSpec
    from bulkembed.sinks import Sink

# The columns Ray Data hands back, one row per unit: counts add up into the run's.
_COUNTS = ("docs", "carried", "tokens", "padded_tokens", "batches")
# Memory a tokenizing task declares: a unit's records and token ids. Declaring it also
# keeps Ray Data from fusing these tasks into the embedding actors (it fuses stages whose
# resource requests are equal), so reading and tokenizing run beside the model.
TOKENIZE_TASK_MEMORY = 256 * 2**20
# A unit's error travels pickled in its row; none is an empty value (a column of Nones
# would reach the actors as floats).
_NO_ERROR = b""
_RESULTS = (
    "part",
    "error",
    *_COUNTS,
    "encode_seconds",
    "counts",
    "dtype",
    "budget",
    "attention",
    "kernel",
    "precision",
)


@dataclass(frozen=True, slots=True)
class _Work:
    """What the tasks and actors need, pickled once with the functions Ray ships."""

    reader: RecordReader
    settings: TokenizerSettings | ImageSettings
    id_key: IdKey
    carrier: CarryOver
    fail_on_bad_records: bool
    spec: ModelSpec
    dtype: DType
    output: AnyPath
    meta: AnyPath
    sink: Callable[[], Sink]
    upserts: UpsertSinks
    fence: Callable[[], None]
    shard: ShardSpec | None
    output_format: OutputFormat
    device: str
    threads: int


def _tokenize_unit(part: str, offset: int, work: _Work) -> list[TokenizedChunk]:
    """Read one unit (from byte `offset`, when not negative, where its format can seek) and
    tokenize it in this process."""
    chunks = work.reader.read_unit(*part_unit(part), offset if offset >= 0 else None)
    with TokenizerPool(work.settings, 0, work.id_key, previous=work.carrier.lookup) as pool:
        # Repeated ids are found within the unit: the units of a cluster run side by side.
        seen = SeenIds(work.id_key)
        files = work.reader.files
        tokenized = drop_duplicate_ids(set_aside(pool.map(chunks), files), seen, files)
        if work.fail_on_bad_records:
            tokenized = fail_on_bad_records(tokenized)
        return list(leave_id_hashes(work.carrier.carry(tokenized)))


def _tokenize_units(batch: dict[str, np.ndarray], work: _Work) -> dict[str, list[Any]]:
    """Ray task: the units named in `batch`, tokenized and pickled for an embedding actor.
    A bulkembed error (a bad record under --on-bad-record fail, an unreadable input) travels
    with its unit, pickled, so that the driver raises it as it is."""
    payloads, errors = [], []
    for part, offset in zip(batch["part"], batch["offset"], strict=True):
        try:
            tokenized = _tokenize_unit(str(part), int(offset), work)
            payloads.append(pickle.dumps(tokenized, protocol=pickle.HIGHEST_PROTOCOL))
            errors.append(_NO_ERROR)
        except BulkembedError as e:
            payloads.append(b"")
            errors.append(pickle.dumps(e))
    return {"part": list(batch["part"]), "payload": payloads, "error": errors}


class _UnitEmbedder:
    """Ray actor: the model on one device; embeds and commits whole units."""

    def __init__(self, work: _Work) -> None:
        self.work = work
        self.reporter = QuietReporter()
        self.session: DeviceSession | Unsettled = start_session(
            work.spec,
            [work.device],
            work.dtype,
            work.threads,
            self.reporter,
        )
        output = work.output
        schema = part_schema(work.reader, work.spec, self.session.embedder, work.output_format)
        run = RunDirectory(output, meta=work.meta, shard=work.shard)
        self.writer = part_writer(
            work.upserts, run.run_id, work.sink(), schema, run.committed, work.fence
        )

    def _write(self, window: EmbeddedWindow) -> None:
        for _ in window.write(self.writer):
            continue

    def _embed_unit(self, tokenized: list[TokenizedChunk]) -> RunStats:
        """Embed and commit one unit (the writer commits it with its last chunk)."""
        stats = RunStats()
        formatted = self.work.output_format.apply
        session = self.session
        gathered = gather_windows(iter(tokenized), session.embedder, session.budget, stats)
        embed_windows(
            gathered, session, formatted, self._write, stats, self.reporter, self._settled
        )
        return stats

    def _settled(self, session: DeviceSession) -> None:
        """The session the first unit's documents settled: the next units run on it."""
        self.session = session

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        rows: dict[str, list[Any]] = {key: [] for key in _RESULTS}
        for part, payload, error in zip(
            batch["part"], batch["payload"], batch["error"], strict=True
        ):
            stats = RunStats()
            if error == _NO_ERROR:
                try:
                    stats = self._embed_unit(pickle.loads(payload))
                except BulkembedError as e:
                    error = pickle.dumps(e)
            rows["part"].append(part)
            rows["error"].append(error)
            for key in _COUNTS:
                rows[key].append(getattr(stats, key))
            rows["encode_seconds"].append(stats.encode_seconds)
            rows["counts"].append(pickle.dumps(stats.counts))
            rows["dtype"].append(self.session.dtype)
            rows["budget"].append(self.session.budget)
            rows["attention"].append(self.session.attention)
            rows["kernel"].append(self.session.embedder.attention_kernel or "")
            rows["precision"].append(pickle.dumps(self.session.precision))
        return rows


def _pending(plan: RunPlan, remaining: Container[str]) -> list[dict[str, Any]]:
    """The units to embed (those in `remaining`), each with the byte offset where it starts
    in an uncompressed JSONL file (-1 elsewhere), so that its task reads only its own
    lines."""
    assert plan.all_units is not None
    pending = [u for u in plan.all_units if u in remaining]
    offsets: dict[int, list[int] | None] = {}
    items = []
    for part in pending:
        index, unit = part_unit(part)
        if index not in offsets:
            offsets[index] = plan.reader.unit_offsets(index)
        starts = offsets[index]
        items.append({"part": part, "offset": -1 if starts is None else starts[unit]})
    return items


def embed_on_ray(
    plan: RunPlan,
    run: RunDirectory,
    sink: Sink,
    done: dict[str, UnitRecord],
    mode: RunMode,
    reporter: Reporter,
) -> RunOutcome:
    """Embed every pending unit on a Ray cluster, into `sink`, the output of `run`, as
    `mode` says: its tasks carry unchanged rows over (the previous output's lookup goes to
    Ray's object store, so that a task on any node reads it), its actors write the upserts
    it asks for."""
    try:
        import ray
        import ray.data
    except ImportError as e:
        raise BulkembedError("--engine ray needs Ray Data: pip install 'bulkembed[ray]'") from e
    pending = _pending(plan, mode.pending(done))
    started = connect(plan.config.run.ray_address)
    try:
        device, actors, threads = pool_actors(plan.config.batching.devices)
        reporter.info(
            f"{plan.model_shown} on Ray: {counted(actors, device + ' actor')}"
            + (f" of {counted(threads, 'thread')}" if device == "cpu" else "")
            + f"; {counted(len(pending), 'unit')} to embed"
            + (f", {len(done)} done before" if done else "")
        )
        outcome = RunOutcome(
            RunStats(started=plan.started),
            f"{device} x{actors} on Ray",
            plan.dtype,
            BatchPolicy.of(plan.spec).tokens,
        )
        if pending:
            work = _Work(
                reader=plan.reader,
                settings=plan.tokenizer_settings,
                id_key=plan.id_key,
                carrier=_shared(mode.carrier()),
                fail_on_bad_records=plan.config.run.on_bad_record is OnBadRecord.FAIL,
                spec=plan.spec,
                dtype=plan.config.batching.dtype,
                output=run.output.resolve(),
                meta=run.meta.resolve(),
                sink=sink.process_copies(),
                upserts=mode.upserts(),
                fence=run.fence(),
                shard=plan.config.run.shard,
                output_format=plan.output_format,
                device=device,
                threads=threads,
            )
            outcome = _run_dataset(work, pending, actors, outcome, reporter)
    finally:
        if started:
            ray.shutdown()
    return outcome


def _shared(carrier: CarryOver) -> CarryOver:
    """`carrier` with its lookup's arrays in Ray's object store: each task reads them from
    there, not from this machine's disk (they are shared, read-only, by the tasks of a
    node)."""
    if carrier.lookup is None:
        return carrier
    import ray

    refs = {name: ray.put(np.asarray(array)) for name, array in carrier.lookup.arrays().items()}
    key = carrier.lookup.key
    return carrier.sharing(carrier.lookup.reopened_by(_lookup_in_store, refs, key))


def _lookup_in_store(refs: dict[str, Any], key: IdKey) -> PreviousLookup:
    """A previous output's lookup, from its arrays in Ray's object store (`_shared`)."""
    import ray

    return PreviousLookup({name: ray.get(ref) for name, ref in refs.items()}, key)


@contextlib.contextmanager
def _quiet_ray_data() -> Iterator[None]:
    """No progress bars or failure logs from Ray Data while a run executes: the reporter
    shows progress, and a failure reaches the user as one line."""
    import ray.data

    context = ray.data.DataContext.get_current()
    logger = logging.getLogger("ray.data")
    saved = (context.enable_progress_bars, context.print_on_execution_start, logger.level)
    context.enable_progress_bars = context.print_on_execution_start = False
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        context.enable_progress_bars, context.print_on_execution_start = saved[:2]
        logger.setLevel(saved[2])


def _run_dataset(
    work: _Work,
    pending: list[dict[str, Any]],
    actors: int,
    outcome: RunOutcome,
    reporter: Reporter,
) -> RunOutcome:
    """Read, tokenize, embed and commit `pending` units through Ray Data; what the actors
    did, added up."""
    import ray.data

    units = ray.data.from_items(pending, override_num_blocks=len(pending))
    tokenized = units.map_batches(
        functools.partial(_tokenize_units, work=work),
        batch_size=1,
        num_cpus=1,
        memory=TOKENIZE_TASK_MEMORY,
    )
    resources: dict[str, Any] = (
        {"num_gpus": 1} if work.device == "cuda" else {"num_cpus": work.threads}
    )
    embedded = tokenized.map_batches(
        _UnitEmbedder,
        batch_size=1,
        fn_constructor_kwargs={"work": work},
        compute=ray.data.ActorPoolStrategy(size=actors),
        **resources,
    )
    stats = outcome.stats
    # The actors load the model as the units come to them: start-up ends here.
    stats.begin_embedding()
    reporter.start(stats)
    dtypes: set[str] = set()
    budgets: set[int] = set()
    layouts: set[str] = set()
    kernels: set[str] = set()
    checks: list[PrecisionCheck] = []
    busy = 0.0
    try:
        with _quiet_ray_data():
            for row in embedded.iter_rows():
                if row["error"] != _NO_ERROR:
                    raise pickle.loads(row["error"])
                for key in _COUNTS:
                    setattr(stats, key, getattr(stats, key) + int(row[key]))
                # Each actor's busy time; the run's figure is the mean device's.
                busy += float(row["encode_seconds"])
                stats.encode_seconds = busy / actors
                stats.counts.add(pickle.loads(row["counts"]), share=1 / actors)
                dtypes.add(row["dtype"])
                budgets.add(int(row["budget"]))
                layouts.add(row["attention"])
                kernels.add(row["kernel"])
                precision = pickle.loads(row["precision"])
                if precision is not None:
                    checks.append(precision)
                reporter.update(stats)
        stats.end_embedding()
        reporter.update(stats)
    except BulkembedError:
        raise
    except Exception as e:  # Ray's own failures: an actor or a node lost, the object store full
        lines = [line for line in str(e).splitlines() if line.strip()]
        raise BulkembedError(
            f"the Ray run failed ({lines[-1].strip() if lines else type(e).__name__}); "
            "committed units are kept: run the same command again to resume "
            "(BULKEMBED_DEBUG=1 shows Ray's report)"
        ) from e
    finally:
        reporter.close()
    return RunOutcome(
        stats,
        outcome.devices,
        ",".join(sorted(dtypes)) or outcome.dtype,
        min(budgets, default=outcome.budget),
        min(checks, key=lambda c: c.agreement.worst, default=None),
        attention=",".join(sorted(layouts)) or None,
        kernel=",".join(sorted(kernels - {""})) or None,
    )

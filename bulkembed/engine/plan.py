"""`plan_run`: one `bulkembed run` resolved before anything is embedded, into a frozen
`RunPlan` (inputs found and their columns checked, model resolved, devices and output
parsed, the units of a `--shard` share counted), and `RunOutcome`, what an engine reports
back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from bulkembed.batching.packing import BatchPolicy
from bulkembed.batching.tokenize import TokenizerSettings
from bulkembed.batching.units import counted_units, shard_parts
from bulkembed.config import Engine, RunConfig, default_tokenize_workers
from bulkembed.engine.modes import RunMode, choose_mode
from bulkembed.errors import UsageError
from bulkembed.output.format import OutputFormat
from bulkembed.run_dir.files import CONFIG_FILE
from bulkembed.sinks import OutputTarget, parse_output
from bulkembed.sources import IdKey, InputFile, RecordReader, format_of, list_inputs
from bulkembed.sources.files import STDIN
from bulkembed.sources.long_texts import TextCut, reader_bound
from bulkembed.sources.reader import SHORT_CHUNK_SIZE
from bulkembed.storage import ObjectPath, StorageOptions, location
from bulkembed.wording import counted
from bulkembed.workers.script_guard import MAIN_GUARD_ADVICE, script_reruns

if TYPE_CHECKING:
    from bulkembed.batching.decode import ImageSettings
    from bulkembed.encoders import VectorSizes
    from bulkembed.engine.precision import PrecisionCheck
    from bulkembed.models.model_spec import ModelSpec
    from bulkembed.reporting.progress import Reporter, RunStats


@dataclass(frozen=True)
class RunPlan:
    """What a run reads, with which model on which devices, and where it writes.

    `devices` are this machine's, resolved, for the local engine; for the Ray engine the
    `--devices` text, resolved on the cluster. `dtype` is the dtype the run starts in as
    far as this process can tell. `all_units` is every unit of the inputs, counted up front
    for `--shard` and `--engine ray`; `my_units` the share of `--shard`. `started` is when
    the command started, on the monotonic clock (see `RunStats`). `unread_directories`
    are input directories that could not be listed (their files are left out). `id_key`
    keys the hashes that every process of the run finds ids by (`IdKey`), drawn anew for
    each run. `mode` is the run's mode (`bulkembed.engine.modes`), picked once here."""

    config: RunConfig
    spec: ModelSpec
    devices: tuple[str, ...]
    dtype: str
    files: tuple[InputFile, ...]
    reader: RecordReader
    output_format: OutputFormat
    target: OutputTarget
    workers: int
    all_units: tuple[str, ...] | None
    my_units: frozenset[str] | None
    mode: RunMode
    storage_options: StorageOptions = StorageOptions()
    started: float = 0.0
    unread_directories: tuple[str, ...] = ()
    id_key: IdKey = field(default_factory=IdKey.fresh)

    @property
    def tokenizer_settings(self) -> TokenizerSettings | ImageSettings:
        """What the worker processes do to the records: tokenize their texts, or decode
        their images (`bulkembed.batching.decode`)."""
        spec = self.spec
        if self.reader.images:
            from bulkembed.batching.decode import ImageSettings

            assert spec.image is not None, "an image run's model has an image tower"
            pixels = self.config.inputs.max_image_pixels
            return ImageSettings(spec.image, pixels, self.storage_options)
        return TokenizerSettings(
            spec.tokenizer_json, spec.max_length, spec.prompt, spec.lowercase, spec.prefix_token_id
        )

    @property
    def model_shown(self) -> str:
        """The model as messages name it: a local folder as `--model` gave it (relative
        paths stay relative), else its hub id."""
        return self.config.model.name if self.spec.local else self.spec.source

    def start_line(self, sizes: VectorSizes, budget: int, done: int, mode: str) -> str:
        """The local engine's start-up line: model, devices, outputs and the figures
        derived from the settings, and `mode`, the run mode's words."""
        spec = self.spec
        outputs = []
        if sizes.dense_dim is not None:
            pooling = spec.pooling.value if spec.pooling else "cls"
            pooled = "image tower" if self.reader.images else f"{pooling} pooling"
            outputs.append(f"dense {sizes.dense_dim}-d ({pooled})")
        if "sparse" in spec.outputs:
            outputs.append("sparse")
        if sizes.multivector_dim is not None:
            outputs.append(f"multivector {sizes.multivector_dim}-d")
        if self.reader.images and spec.image is not None:
            height, width = spec.image.shape
            sizing = (
                f"images at {height}x{width} = {spec.image.tokens} tokens; batches of {budget} "
                f"tokens = {max(1, budget // spec.image.tokens)} images; "
                f"{counted(self.workers, 'image decoder process', 'image decoder processes')}"
            )
        else:
            sizing = (
                f"max length {spec.max_length}; batches of {budget} tokens = "
                f"{max(1, budget // spec.max_length)} docs at max length; "
                f"{counted(self.workers, 'tokenizer process', 'tokenizer processes')}"
            )
        return (
            f"{self.model_shown} on {', '.join(self.devices)} ({self.dtype}): "
            f"{', '.join(outputs)}; {sizing}; "
            f"{counted(len(self.files), 'input file')}"
            + (f"; resuming after {counted(done, 'done unit')}" if done else "")
            + (f"; {mode}" if mode else "")
        )

    def run_info(self, outcome: RunOutcome | None = None) -> dict[str, Any]:
        """What `config.json` and `summary.json` say of the run's settings; with `outcome`,
        as the engine found them (devices, dtype, tuned budget, precision check)."""
        spec, config = self.spec, self.config
        return {
            "model": spec.source,
            "recipe": spec.recipe,
            "device": ",".join(self.devices) if outcome is None else outcome.devices,
            "dtype": self.dtype if outcome is None else outcome.dtype,
            "backend": (
                outcome.backend
                if outcome is not None and outcome.backend is not None
                else config.batching.backend.value
            ),
            "attention": (
                outcome.attention
                if outcome is not None and outcome.attention is not None
                else config.batching.attention.value
            ),
            "attention_kernel": None if outcome is None else outcome.kernel,
            "compile": spec.compile,
            # What the records are: texts, or images (embedded by a two-tower model's image
            # tower; `summary.json` then gives images/s and the decode stage's seconds).
            "modality": "images" if self.reader.images else "texts",
            "outputs": ",".join(spec.outputs),
            "pooling": spec.pooling.value if spec.pooling else None,
            "normalize": spec.normalize,
            "max_length": spec.max_length,
            "max_batch_tokens": (
                BatchPolicy.of(spec).tokens if outcome is None else outcome.budget
            ),
            "tokenize_workers": self.workers,
            "output": self.target.label,
            "dtype_check": (
                None
                if outcome is None or outcome.precision is None
                else outcome.precision.describe()
            ),
            "shard": None if config.run.shard is None else config.run.shard.label,
        }


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What an engine did: its counters, the devices and dtype(s) it computed on, the token
    budget it batched by, the `--dtype auto` check it made (the worst, over Ray actors), the
    backend that ran the model and the batch layout."""

    stats: RunStats
    devices: str
    dtype: str
    budget: int
    precision: PrecisionCheck | None = None
    # What ran the model (`torch`, `openvino`), where one process knows it; and how its
    # batches ran (`flat`, `padded`), where the engine knows it.
    backend: str | None = None
    attention: str | None = None
    # The attention kernel of flat batches (`encoders.kernels`), where they ran flat.
    kernel: str | None = None


def _check_target(config: RunConfig, target: OutputTarget) -> None:
    """Refuse options that the kind of `--output` cannot take."""
    capabilities = target.capabilities
    if (
        config.run.shard is not None or config.run.engine is Engine.RAY
    ) and not capabilities.many_writers:
        what = "--shard" if config.run.shard is not None else "--engine ray"
        raise UsageError(
            f"{what} writes from several processes, and {target.label} takes rows from one: "
            "pass a directory or lancedb://PATH as --output"
        )
    if (config.output.index or config.output.fts) and not capabilities.indexes:
        raise UsageError(
            f"--index and --fts apply to an output that keeps indexes (lancedb://...), "
            f"not to {target.label}"
        )
    if config.output.fts and config.inputs.text_column not in config.output.keep_columns:
        raise UsageError(
            f"--fts indexes the text: add '{config.inputs.text_column}' to --keep-columns"
        )


def _check_since(config: RunConfig, target: OutputTarget, options: StorageOptions) -> None:
    """Refuse a `--since` that names the `--output` itself, but for an output synced in
    place (`engine.sync`)."""
    if config.run.since is None or parse_output(config.run.since, options).capabilities.in_place:
        return
    since = location(config.run.since, options).resolve()
    if target.path is not None and since == target.path.resolve():
        raise UsageError("--since must name another output than --output")


def plan_run(config: RunConfig, reporter: Reporter, started: float) -> RunPlan:
    """Find the inputs and check their columns, resolve the model and the devices, for a
    command that `started` at that time (monotonic clock)."""
    from bulkembed.models.devices import dtype_choice, resolve_devices
    from bulkembed.models.model_spec import resolve_model

    reporter.phase("listing the inputs")
    options = StorageOptions.parse(config.run.storage_options)
    target = parse_output(config.output.target, options)
    remote = target.path if isinstance(target.path, ObjectPath) else None
    if config.run.shard is not None and remote is not None and remote.scheme != "s3":
        raise UsageError(
            f"--shard writing to {remote.scheme}:// needs conditional writes, which this "
            "version uses on S3 only: write to s3:// or a shared filesystem, or run one "
            "process (--engine ray for many machines)"
        )
    _check_target(config, target)
    _check_since(config, target, options)
    mode = choose_mode(config, target, options)
    meta = target.run_directory
    earlier = meta is not None and (meta / CONFIG_FILE).exists()
    if STDIN in config.inputs.paths and earlier and not config.run.overwrite:
        raise UsageError(
            f"{target.label} holds an earlier run, and input from stdin (-) cannot be "
            "resumed: pass --overwrite to start over, or choose another --output"
        )
    skipped: list[tuple[str, str]] = []
    files = list_inputs(config.inputs.paths, exclude=target.path, skipped=skipped, options=options)
    for directory, why in skipped:
        reporter.warn(f"input directory {directory} ({why}) cannot be read: its files are left out")
    files, images = _one_kind(config, files, reporter)
    reader = _reader(config, files, images)
    reader.check()
    spec = resolve_model(config)
    if reader.images and spec.image is None:
        raise UsageError(
            f"the inputs are images, and {spec.source} reads texts only: embed them with a "
            "two-tower model (clip-vit-base-patch32, siglip2-base-patch16-224, ...)"
        )
    if not reader.images:
        reader.text_cut = TextCut(reader_bound(spec.max_length), spec.prompt, spec.lowercase)
    if config.run.engine is Engine.RAY:
        # The cluster's devices, not this machine's: the Ray engine resolves both there.
        devices, dtype = [config.batching.devices], "float32"
    else:
        devices = resolve_devices(config.batching.devices)
        dtype = dtype_choice(config.batching.dtype, devices[0])
    spec = _on_devices(config, spec, devices, files)
    dtype = spec.int8 or dtype
    distributed = config.run.shard is not None or config.run.engine is Engine.RAY
    units = counted_units(files, config.inputs.records_per_unit) if distributed else None
    workers = config.batching.tokenize_workers
    workers = default_tokenize_workers(devices) if workers is None else workers
    reruns = script_reruns() if workers else None
    if reruns is not None:
        processes = counted(workers, "tokenizer process", "tokenizer processes")
        reporter.warn(
            f"tokenizing in this process, not in {processes}: {reruns}; "
            f"{MAIN_GUARD_ADVICE} to use them"
        )
        workers = 0
    return RunPlan(
        config=config,
        spec=spec,
        devices=tuple(devices),
        dtype=dtype,
        files=tuple(files),
        reader=reader,
        output_format=OutputFormat.for_run(config.model, spec),
        target=target,
        workers=workers,
        all_units=None if units is None else tuple(units),
        my_units=None
        if units is None or config.run.shard is None
        else shard_parts(units, config.run.shard),
        mode=mode,
        storage_options=options,
        started=started,
        unread_directories=tuple(directory for directory, _ in skipped),
    )


def _on_devices(
    config: RunConfig, spec: ModelSpec, devices: list[str], files: list[InputFile]
) -> ModelSpec:
    """`spec` with what the devices decide: `--compile` left out (`compiles_by_default`)
    and the int8 dtype the run tries (`int8_mode`)."""
    from bulkembed.encoders.compiling import compiles_by_default
    from bulkembed.encoders.int8 import int8_mode

    if config.batching.compile is None:
        input_bytes = sum(f.size for f in files)
        spec = replace(spec, compile=compiles_by_default(spec, devices[0], input_bytes))
    one_process = config.run.engine is not Engine.RAY
    return replace(spec, int8=int8_mode(config.batching.dtype, devices, spec, one_process))


def _reader(config: RunConfig, files: list[InputFile], images: bool) -> RecordReader:
    """The reader of the run's inputs: of their texts, or of their `images`."""
    return RecordReader(
        files,
        config.inputs.image_column or config.inputs.text_column,
        config.inputs.id_column,
        records_per_unit=config.inputs.records_per_unit,
        keep_columns=config.output.keep_columns,
        short_chunk_size=SHORT_CHUNK_SIZE,
        images=images,
    )


def _one_kind(
    config: RunConfig, files: list[InputFile], reporter: Reporter
) -> tuple[list[InputFile], bool]:
    """The inputs the run embeds, and whether they are images: a column of images is named
    (`--image-column`), or every input is of images (folders of image files, WebDataset
    shards). A run embeds texts or images: where the inputs hold both (a thumbnail beside
    Parquet files, the Parquet of metadata img2dataset writes beside its shards), it
    embeds the texts, and the images are left out with a warning."""
    if config.inputs.image_column is not None:
        return files, True
    images = [f for f in files if format_of(f).images]
    if not images or len(images) == len(files):
        return files, bool(images)
    reporter.warn(
        f"{counted(len(images), 'input')} of images left out ({images[0].path}): a run embeds "
        "texts or images; name the images alone (a folder, a glob) to embed them"
    )
    return [f for f in files if not format_of(f).images], False

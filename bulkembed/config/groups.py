"""The settings of a run in five frozen groups: what it reads (`InputSettings`), the model
and what shapes its vectors (`ModelSettings`), where and how fast the model runs
(`BatchSettings`), what it writes (`OutputSettings`) and how the run behaves
(`RunSettings`). Each group takes what a Python caller may pass for convenience (a string
for an enum, one path as a string, the command line's spellings: "auto", "all", counts and
fractions as strings) and checks itself, with the command line's one-line errors. A field
whose `metadata` says `recorded: False` is not one an output records or `load` takes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from bulkembed.config.choices import (
    DEFAULT_MAX_DELETES,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_RECORDS_PER_UNIT,
    OUTPUTS,
    RESERVED_COLUMNS,
    Attention,
    Backend,
    DType,
    DTypeOut,
    Engine,
    IndexType,
    OnBadRecord,
    Pooling,
    Quantize,
    ShardSpec,
    StreamFormat,
)
from bulkembed.errors import UsageError
from bulkembed.spellings import AUTO, bad_record_limit, batch_tokens, delete_limit

# A setting that is the run's, not the vectors' or the model's: not recorded, not `load`'s.
NOT_RECORDED = {"recorded": False}


def _set(group: Any, name: str, value: Any) -> None:
    object.__setattr__(group, name, value)


def _coerce_enums(group: Any, kinds: dict[str, type[Enum]]) -> None:
    """Each of `kinds`' fields of `group` as its enum; a value outside the choices is a
    one-line error naming the option."""
    for name, kind in kinds.items():
        value = getattr(group, name)
        if value is None or isinstance(value, kind):
            continue
        try:
            coerced = kind(value)
        except ValueError:
            values = [member.value for member in kind]
            choices = " or ".join(values) if len(values) == 2 else "one of " + ", ".join(values)
            option = f"--{name.replace('_', '-')}"
            raise UsageError(f"{option}: choose {choices} (got {value!r})") from None
        _set(group, name, coerced)


def _as_tuple(group: Any, *names: str) -> None:
    """Each of `names` as a tuple: one string is a tuple of one."""
    for name in names:
        value = getattr(group, name)
        if isinstance(value, str):
            _set(group, name, (value,))
        elif value is not None:
            _set(group, name, tuple(value))


def _at_least_one(group: Any, *names: str) -> None:
    for name in names:
        value = getattr(group, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


def _path_text(group: Any, name: str) -> None:
    value = getattr(group, name)
    if isinstance(value, os.PathLike):
        _set(group, name, os.fspath(value))


@dataclass(frozen=True)
class InputSettings:
    """What a run reads: `paths` (files, directories, globs, `-` for stdin), the columns
    of texts and ids, and how it cuts them into units of work."""

    paths: tuple[str, ...]
    text_column: str = "text"
    id_column: str | None = None
    limit: int | None = None
    records_per_unit: int = DEFAULT_RECORDS_PER_UNIT
    verify_inputs: bool = False
    # The column of images in tables (None: folders of image files are the images).
    image_column: str | None = None
    # Larger images are set aside: decoding them would take too much memory.
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS

    def __post_init__(self) -> None:
        paths: Any = self.paths
        if isinstance(paths, (str, os.PathLike)):
            _set(self, "paths", (os.fspath(paths),))
        else:
            _set(self, "paths", tuple(os.fspath(p) for p in paths))
        if not self.paths:
            raise UsageError("no input given: pass one or more files, directories or globs")
        if self.paths.count("-") > 1:
            raise UsageError("stdin (-) can be given as an input once")
        _at_least_one(self, "limit", "records_per_unit", "max_image_pixels")

    @property
    def stdin(self) -> bool:
        """Whether one input is stdin, read once, by one process."""
        return "-" in self.paths


@dataclass(frozen=True)
class ModelSettings:
    """The model (`name`: a recipe, a hub id or a local folder) and every setting that
    shapes its vectors: what an output records of its encoder (`recorded_settings`)."""

    name: str = field(metadata=NOT_RECORDED)
    revision: str | None = None
    recipe: str | None = None
    pooling: Pooling | None = None
    normalize: bool | None = None
    prompt: str | None = None
    # Recorded as the prompt it names.
    prompt_name: str | None = field(default=None, metadata=NOT_RECORDED)
    outputs: tuple[str, ...] | None = None
    sparse_top_k: int | None = None
    dim: int | None = None
    dtype_out: DTypeOut = DTypeOut.FLOAT32
    quantize: Quantize | None = None
    max_length: int | None = None

    def __post_init__(self) -> None:
        _path_text(self, "name")
        _coerce_enums(self, {"pooling": Pooling, "dtype_out": DTypeOut, "quantize": Quantize})
        _as_tuple(self, "outputs")
        if self.quantize is not None and self.dtype_out is not DTypeOut.FLOAT32:
            # float32 is the default: only another --dtype-out says something --quantize denies.
            raise UsageError(
                f"--quantize {self.quantize.value} and --dtype-out {self.dtype_out.value} "
                "conflict: quantized vectors are integers; pass one of them"
            )
        if self.prompt is not None and self.prompt_name is not None:
            raise UsageError("--prompt and --prompt-name conflict: pass one of them")
        unknown = sorted(set(self.outputs or ()) - set(OUTPUTS))
        if unknown:
            raise UsageError(
                f"--outputs: unknown {'output' if len(unknown) == 1 else 'outputs'} "
                f"{', '.join(unknown)} (choose from {', '.join(OUTPUTS)})"
            )
        if self.outputs is not None and not self.outputs:
            raise UsageError("--outputs: name at least one of dense, sparse, multivector")
        _at_least_one(self, "max_length", "sparse_top_k", "dim")


@dataclass(frozen=True)
class BatchSettings:
    """Where and how fast the model runs: its vectors are the same but for rounding. The
    token budget is `max_batch_tokens` (None: the recipe's, else the default), or, given as
    "auto", probed on each device (`probe_budget`)."""

    devices: str = "auto"
    dtype: DType = DType.AUTO
    # None: compile where the run is long enough (`encoders.backend.compiles_by_default`).
    compile: bool | None = None
    backend: Backend = Backend.AUTO
    attention: Attention = Attention.AUTO
    max_batch_tokens: int | None = None
    probe_budget: bool = field(default=False, metadata=NOT_RECORDED)
    tokenize_workers: int | None = field(default=None, metadata=NOT_RECORDED)

    def __post_init__(self) -> None:
        _coerce_enums(self, {"dtype": DType, "backend": Backend, "attention": Attention})
        budget: object = self.max_batch_tokens
        if isinstance(budget, str):
            _set(self, "max_batch_tokens", batch_tokens(budget))
            if budget.strip().lower() == AUTO:
                _set(self, "probe_budget", True)
        if self.compile is True and self.backend is Backend.OPENVINO:
            raise UsageError(
                "--compile and --backend openvino conflict: --compile applies to --backend torch"
            )
        if self.attention is Attention.FLAT and self.backend is Backend.OPENVINO:
            raise UsageError(
                "--attention flat and --backend openvino conflict: flat batches run in PyTorch"
            )
        _at_least_one(self, "max_batch_tokens")
        if self.tokenize_workers is not None and self.tokenize_workers < 0:
            raise UsageError("--tokenize-workers must be 0 (tokenize in-process) or more")


@dataclass(frozen=True)
class OutputSettings:
    """What a run writes: `target` (a directory, `lancedb://...`, `-`), the input columns
    it keeps, and the form of a stream or a table."""

    target: str
    keep_columns: tuple[str, ...] = ()
    stream_format: StreamFormat | None = None
    index: bool = False
    index_type: IndexType = IndexType.AUTO
    index_partitions: int | None = None
    fts: bool = False

    def __post_init__(self) -> None:
        _path_text(self, "target")
        _coerce_enums(self, {"stream_format": StreamFormat, "index_type": IndexType})
        _as_tuple(self, "keep_columns")
        reserved = sorted(set(self.keep_columns) & set(RESERVED_COLUMNS))
        if reserved:
            raise UsageError(
                f"--keep-columns: {', '.join(reserved)} is a column bulkembed writes itself"
            )
        if len(set(self.keep_columns)) != len(self.keep_columns):
            raise UsageError("--keep-columns names a column twice")
        if self.stream_format is not None and self.target != "-":
            raise UsageError("--stream-format applies to --output - only")
        if self.index_partitions is not None and self.index_partitions < 1:
            raise UsageError("--index-partitions must be at least 1")


@dataclass(frozen=True)
class RunSettings:
    """How the run behaves: bad records, starting over, incremental runs and their deletes,
    where its work runs (`--shard`, `--engine`), the output's lock and object storage."""

    on_bad_record: OnBadRecord = OnBadRecord.SKIP
    max_bad_records: float | None = None
    overwrite: bool = False
    quiet: bool = False
    since: str | None = None
    max_deletes: float | None = DEFAULT_MAX_DELETES
    shard: ShardSpec | None = None
    engine: Engine = Engine.LOCAL
    ray_address: str | None = None
    storage_options: tuple[str, ...] = ()
    break_lock: bool = False
    # Where the run's Prometheus metrics go while it runs (`bulkembed.reporting.metrics`).
    metrics_port: int | None = None
    metrics_file: str | None = None

    def __post_init__(self) -> None:
        _coerce_enums(self, {"on_bad_record": OnBadRecord, "engine": Engine})
        _as_tuple(self, "storage_options")
        shard: object = self.shard
        if isinstance(shard, str):
            _set(self, "shard", ShardSpec.parse(shard))
        self._check_limits()
        if self.ray_address is not None and self.engine is not Engine.RAY:
            raise UsageError("--ray-address applies to --engine ray only")

    def _check_limits(self) -> None:
        """`--max-bad-records` a count or a fraction below 1, `--max-deletes` a count, a
        fraction below 1 or "all" (None), from their spellings too."""
        bad: object = self.max_bad_records
        if isinstance(bad, str):
            _set(self, "max_bad_records", bad_record_limit(bad))
        deletes: object = self.max_deletes
        if isinstance(deletes, str):
            _set(self, "max_deletes", delete_limit(deletes))
        if self.max_deletes == 0:
            # `-0` is 0: no delete allowed, and said so without a sign.
            _set(self, "max_deletes", 0.0)
        limit = self.max_bad_records
        if limit is not None and (limit < 0 or (limit >= 1 and limit != int(limit))):
            raise UsageError(
                f"--max-bad-records {limit}: give a count (25) or a fraction of the records "
                "read below 1 (0.01)"
            )
        deletes = self.max_deletes
        odd = deletes is not None and not math.isfinite(deletes)
        if deletes is not None and (
            odd or deletes < 0 or (deletes >= 1 and deletes != int(deletes))
        ):
            raise UsageError(
                f"--max-deletes {deletes:g}: give a count (500), a fraction of the previous "
                "output's rows below 1 (0.25), or None for no limit"
            )

    @property
    def distributed(self) -> bool:
        """Whether units are committed from several processes into one output."""
        return self.shard is not None or self.engine is Engine.RAY


def recorded_settings(group: type) -> tuple[str, ...]:
    """The settings of `group` an output records or `load` takes, by name."""
    return tuple(f.name for f in fields(group) if f.metadata.get("recorded", True))

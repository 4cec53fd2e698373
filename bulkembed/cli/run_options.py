"""The options of `bulkembed run` beside the model's, in groups of what they are about
(added to the command by `model_options.with_group`): what is read (`InputOptions`), where
and how it is written (`OutputOptions`), and what runs it (`ExecutionOptions`). Each group
gives the settings of `RunConfig` it holds (`settings`), spelled as the command line took
them: `RunConfig` parses the spellings (`bulkembed.spellings`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from bulkembed.cli.model_options import names
from bulkembed.cli.options import (
    BreakLock,
    Devices,
    EngineOption,
    Fts,
    IdColumn,
    ImageColumn,
    Index,
    IndexPartitions,
    IndexTypeOption,
    KeepColumns,
    Limit,
    MaxBadRecords,
    MaxDeletes,
    MaxImagePixels,
    MetricsFile,
    MetricsPort,
    OnBadRecordOption,
    Overwrite,
    Quiet,
    RayAddress,
    RecordsPerUnit,
    ShardOption,
    Since,
    StorageOption,
    StreamFormatOption,
    TextColumn,
    TokenizeWorkers,
    VerifyInputs,
)
from bulkembed.config import (
    DEFAULT_MAX_DELETES,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_RECORDS_PER_UNIT,
    Engine,
    IndexType,
    OnBadRecord,
)
from bulkembed.spellings import bad_record_limit, delete_limit


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """What is read: the text and id columns, which records, what to do with bad ones."""

    text_column: TextColumn = "text"
    image_column: ImageColumn = None
    id_column: IdColumn = None
    limit: Limit = None
    on_bad_record: OnBadRecordOption = OnBadRecord.SKIP
    max_bad_records: MaxBadRecords = None
    keep_columns: KeepColumns = None
    verify_inputs: VerifyInputs = False
    records_per_unit: RecordsPerUnit = DEFAULT_RECORDS_PER_UNIT
    max_image_pixels: MaxImagePixels = DEFAULT_MAX_IMAGE_PIXELS

    def settings(self) -> dict[str, Any]:
        """The settings of `RunConfig` these options give, by its field names."""
        given = dataclasses.asdict(self)
        given["max_bad_records"] = bad_record_limit(self.max_bad_records)
        given["keep_columns"] = names(self.keep_columns)
        return given


@dataclasses.dataclass(frozen=True)
class OutputOptions:
    """Where and how the vectors are written: starting over, the stream's format, indexes,
    `--since` and what it may delete, object storage, the output's lock."""

    overwrite: Overwrite = False
    stream_format: StreamFormatOption = None
    index: Index = False
    index_type: IndexTypeOption = IndexType.AUTO
    index_partitions: IndexPartitions = None
    fts: Fts = False
    since: Since = None
    max_deletes: MaxDeletes = f"{DEFAULT_MAX_DELETES:g}"
    storage_option: StorageOption = None
    break_lock: BreakLock = False

    def settings(self) -> dict[str, Any]:
        """The settings of `RunConfig` these options give, by its field names."""
        given = dataclasses.asdict(self)
        given["max_deletes"] = delete_limit(self.max_deletes)
        given["storage_options"] = tuple(given.pop("storage_option") or ())
        return given


@dataclasses.dataclass(frozen=True)
class ExecutionOptions:
    """What runs the job: tokenizer processes, devices, `--shard`, the engine, and how
    much it says."""

    tokenize_workers: TokenizeWorkers = None
    devices: Devices = "auto"
    shard: ShardOption = None
    engine: EngineOption = Engine.LOCAL
    ray_address: RayAddress = None
    quiet: Quiet = False
    metrics_port: MetricsPort = None
    metrics_file: MetricsFile = None

    def settings(self) -> dict[str, Any]:
        """The settings of `RunConfig` these options give, by its field names (`--shard`
        as "I/N", which `RunConfig` parses)."""
        return dataclasses.asdict(self)

"""Frozen run configuration, recipes (one YAML per model) and their loading.

Nothing here imports torch: the CLI builds a `RunConfig` before any heavy import.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from bulkembed.errors import UsageError
from bulkembed.spellings import AUTO, bad_record_limit, batch_tokens, delete_limit

DEFAULT_MAX_BATCH_TOKENS = 16384
# Records per unit of work in JSON lines, Arrow and dataset inputs (a Parquet unit is a
# row group): the granularity of parts and of resume.
DEFAULT_RECORDS_PER_UNIT = 4096
# What an incremental run may delete at most (`--max-deletes`): a tenth of the previous
# output's rows.
DEFAULT_MAX_DELETES = 0.1
OUTPUTS = ("dense", "sparse", "multivector")
# Column names the output uses for itself (`vector` is the dense column in LanceDB).
RESERVED_COLUMNS = ("id", *OUTPUTS, "content_hash", "vector")
# The model's settings that shape its vectors, by their `RunConfig` names: what an output
# records of its encoder besides the model (`bulkembed.output.recorded`).
VECTOR_SETTINGS = (
    "revision",
    "recipe",
    "pooling",
    "normalize",
    "prompt",
    "outputs",
    "sparse_top_k",
    "dim",
    "dtype_out",
    "quantize",
    "max_length",
)
# Where and how fast a model runs: its vectors are the same but for rounding.
RUNTIME_SETTINGS = ("devices", "dtype", "compile", "backend", "attention", "max_batch_tokens")


class Pooling(str, Enum):
    """How token vectors become one dense vector."""

    CLS = "cls"
    MEAN = "mean"
    LAST_TOKEN = "last-token"


class DType(str, Enum):
    """Compute precision of the model. `auto` is bfloat16 or float16 on CUDA, bfloat16 on
    CPUs with bfloat16 units, else float32 (see `bulkembed.models.devices.dtype_choice`)."""

    AUTO = "auto"
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"


class Backend(str, Enum):
    """What runs the model's transformer. `auto` is OpenVINO on a CPU for the architectures
    it is tested on (BERT, RoBERTa, XLM-RoBERTa) when the `openvino` package is installed,
    else PyTorch (see `bulkembed.encoders.backend.choose_backend`)."""

    AUTO = "auto"
    TORCH = "torch"
    OPENVINO = "openvino"


class Attention(str, Enum):
    """How a batch runs through the transformer. `padded`: every document padded to the
    batch's longest, with an attention mask. `flat`: the documents' tokens laid end to end,
    attention within each document (variable-length attention). `auto` is flat on CUDA for
    BERT, RoBERTa and XLM-RoBERTa models where a variable-length kernel runs the dtype, else
    padded (see `bulkembed.encoders.backend.choose_attention`)."""

    AUTO = "auto"
    PADDED = "padded"
    FLAT = "flat"

    @classmethod
    def ran(cls, unpadded: bool) -> Attention:
        """The layout batches ran in: flat when they ran unpadded."""
        return cls.FLAT if unpadded else cls.PADDED


class DTypeOut(str, Enum):
    """Float type of the written dense and multi-vector columns."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"


class Quantize(str, Enum):
    """Integer encodings of dense vectors."""

    INT8 = "int8"
    UINT8 = "uint8"
    BINARY = "binary"
    UBINARY = "ubinary"


class StreamFormat(str, Enum):
    """What `--output -` writes."""

    JSONL = "jsonl"
    ARROW = "arrow"


class IndexType(str, Enum):
    """The LanceDB vector index `--index` builds; `auto` picks by the table's size."""

    AUTO = "auto"
    IVF_PQ = "ivf_pq"
    IVF_HNSW_SQ = "ivf_hnsw_sq"
    IVF_FLAT = "ivf_flat"


class Engine(str, Enum):
    """Where the work runs: this machine's processes, or a Ray cluster's tasks and actors."""

    LOCAL = "local"
    RAY = "ray"


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """`--shard I/N`: this run takes the units of work whose index is I modulo N."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> ShardSpec:
        index, slash, count = text.partition("/")
        if slash and index.strip().isdigit() and count.strip().isdigit():
            shard = cls(int(index), int(count))
            if shard.index < shard.count:
                return shard
        raise UsageError(
            f"--shard {text}: expected I/N with 0 <= I < N, e.g. 0/4 for the first of four runs"
        )

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


class OnBadRecord(str, Enum):
    """What to do with a record that cannot be embedded."""

    SKIP = "skip"
    FAIL = "fail"


@dataclass(frozen=True)
class RunConfig:
    """Everything one `bulkembed run` needs, parsed and validated by the CLI or the API caller."""

    inputs: tuple[str, ...]
    output: str
    model: str
    recipe: str | None = None
    revision: str | None = None
    text_column: str = "text"
    id_column: str | None = None
    max_batch_tokens: int | None = None
    probe_budget: bool = False
    max_length: int | None = None
    tokenize_workers: int | None = None
    devices: str = "auto"
    dtype: DType = DType.AUTO
    # None: compile where the run is long enough (`encoders.backend.compiles_by_default`).
    compile: bool | None = None
    backend: Backend = Backend.AUTO
    attention: Attention = Attention.AUTO
    pooling: Pooling | None = None
    normalize: bool | None = None
    prompt: str | None = None
    prompt_name: str | None = None
    limit: int | None = None
    outputs: tuple[str, ...] | None = None
    sparse_top_k: int | None = None
    dim: int | None = None
    dtype_out: DTypeOut = DTypeOut.FLOAT32
    quantize: Quantize | None = None
    on_bad_record: OnBadRecord = OnBadRecord.SKIP
    max_bad_records: float | None = None
    overwrite: bool = False
    quiet: bool = False
    keep_columns: tuple[str, ...] = ()
    stream_format: StreamFormat | None = None
    index: bool = False
    index_type: IndexType = IndexType.AUTO
    index_partitions: int | None = None
    fts: bool = False
    since: str | None = None
    max_deletes: float | None = DEFAULT_MAX_DELETES
    verify_inputs: bool = False
    records_per_unit: int = DEFAULT_RECORDS_PER_UNIT
    shard: ShardSpec | None = None
    engine: Engine = Engine.LOCAL
    ray_address: str | None = None
    storage_options: tuple[str, ...] = ()
    break_lock: bool = False

    def __post_init__(self) -> None:
        self._coerce()
        if not self.inputs:
            raise UsageError("no input given: pass one or more files, directories or globs")
        if self.quantize is not None and self.dtype_out is not DTypeOut.FLOAT32:
            # float32 is the default: only another --dtype-out says something --quantize denies.
            raise UsageError(
                f"--quantize {self.quantize.value} and --dtype-out {self.dtype_out.value} "
                "conflict: quantized vectors are integers; pass one of them"
            )
        if self.prompt is not None and self.prompt_name is not None:
            raise UsageError("--prompt and --prompt-name conflict: pass one of them")
        if self.compile is True and self.backend is Backend.OPENVINO:
            raise UsageError(
                "--compile and --backend openvino conflict: --compile applies to --backend torch"
            )
        if self.attention is Attention.FLAT and self.backend is Backend.OPENVINO:
            raise UsageError(
                "--attention flat and --backend openvino conflict: flat batches run in PyTorch"
            )
        unknown = sorted(set(self.outputs or ()) - set(OUTPUTS))
        if unknown:
            raise UsageError(
                f"--outputs: unknown {'output' if len(unknown) == 1 else 'outputs'} "
                f"{', '.join(unknown)} (choose from "
                f"{', '.join(OUTPUTS)})"
            )
        if self.outputs is not None and not self.outputs:
            raise UsageError("--outputs: name at least one of dense, sparse, multivector")
        for name in (
            "max_batch_tokens",
            "max_length",
            "limit",
            "sparse_top_k",
            "dim",
            "records_per_unit",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        if self.tokenize_workers is not None and self.tokenize_workers < 0:
            raise UsageError("--tokenize-workers must be 0 (tokenize in-process) or more")
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
        self._check_output_options()
        self._check_distribution()

    def _coerce(self) -> None:
        """Take what a Python caller may pass for convenience: a string for an enum, one
        input as a string, `--shard` as "I/N"; a value outside an enum's choices is a
        one-line error here, before anything loads."""
        for name, kind in _ENUM_FIELDS.items():
            value = getattr(self, name)
            if value is None or isinstance(value, kind):
                continue
            try:
                coerced = kind(value)
            except ValueError:
                values = [member.value for member in kind]
                choices = " or ".join(values) if len(values) == 2 else "one of " + ", ".join(values)
                option = f"--{name.replace('_', '-')}"
                raise UsageError(f"{option}: choose {choices} (got {value!r})") from None
            object.__setattr__(self, name, coerced)
        if isinstance(self.inputs, (str, os.PathLike)):
            object.__setattr__(self, "inputs", (os.fspath(self.inputs),))
        else:
            object.__setattr__(self, "inputs", tuple(os.fspath(i) for i in self.inputs))
        for name in ("outputs", "keep_columns", "storage_options"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, (value,))
            elif value is not None:
                object.__setattr__(self, name, tuple(value))
        self._coerce_spellings()
        if self.max_deletes == 0:
            # `-0` is 0: no delete allowed, and said so without a sign.
            object.__setattr__(self, "max_deletes", 0.0)
        shard: object = self.shard
        if isinstance(shard, str):
            object.__setattr__(self, "shard", ShardSpec.parse(shard))
        for name in ("output", "model"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))

    def _coerce_spellings(self) -> None:
        """The CLI's spellings, from a Python caller too (`spellings`): `max_batch_tokens`
        a number or "auto" (which probes the budget), `max_deletes` a count, a fraction or
        "all", `max_bad_records` a count or a fraction; each wrong one is the CLI's error."""
        budget: object = self.max_batch_tokens
        if isinstance(budget, str):
            object.__setattr__(self, "max_batch_tokens", batch_tokens(budget))
            if budget.strip().lower() == AUTO:
                object.__setattr__(self, "probe_budget", True)
        deletes: object = self.max_deletes
        if isinstance(deletes, str):
            object.__setattr__(self, "max_deletes", delete_limit(deletes))
        bad: object = self.max_bad_records
        if isinstance(bad, str):
            object.__setattr__(self, "max_bad_records", bad_record_limit(bad))

    def _check_distribution(self) -> None:
        """`--shard` and `--engine ray` commit units from several processes at once into one
        output: what needs the whole corpus in one process is refused (an output that takes
        rows from one process only is refused by the plan, which knows its kind)."""
        if self.ray_address is not None and self.engine is not Engine.RAY:
            raise UsageError("--ray-address applies to --engine ray only")
        if self.inputs.count("-") > 1:
            raise UsageError("stdin (-) can be given as an input once")
        if "-" in self.inputs and (self.since or self.shard or self.engine is Engine.RAY):
            raise UsageError(
                "input from stdin (-) is read once, by one process: it cannot be combined "
                "with --since, --shard or --engine ray; write it to a file first"
            )
        if self.shard is None and self.engine is Engine.LOCAL:
            return
        what = "--shard" if self.engine is Engine.LOCAL else "--engine ray"
        refused = {
            "--limit": self.limit is not None,
            "--overwrite": self.overwrite and self.shard is not None,
            f"--quantize {getattr(self.quantize, 'value', '')}": self.quantize
            in (Quantize.INT8, Quantize.UINT8),
        }
        for option, given in refused.items():
            if given:
                raise UsageError(
                    f"{what} cannot be combined with {option}: it needs the whole corpus in "
                    "one run (run without it, or remove the output by hand to start over)"
                )

    def _check_output_options(self) -> None:
        reserved = sorted(set(self.keep_columns) & set(RESERVED_COLUMNS))
        if reserved:
            raise UsageError(
                f"--keep-columns: {', '.join(reserved)} is a column bulkembed writes itself"
            )
        if len(set(self.keep_columns)) != len(self.keep_columns):
            raise UsageError("--keep-columns names a column twice")
        if self.stream_format is not None and self.output != "-":
            raise UsageError("--stream-format applies to --output - only")
        if self.index_partitions is not None and self.index_partitions < 1:
            raise UsageError("--index-partitions must be at least 1")
        if self.index and self.quantize is not None:
            raise UsageError("--index needs float vectors: leave out --quantize")


# The fields `RunConfig` takes as strings too, and the enum each becomes.
_ENUM_FIELDS: dict[str, type[Enum]] = {
    "dtype": DType,
    "backend": Backend,
    "attention": Attention,
    "pooling": Pooling,
    "dtype_out": DTypeOut,
    "quantize": Quantize,
    "on_bad_record": OnBadRecord,
    "stream_format": StreamFormat,
    "index_type": IndexType,
    "engine": Engine,
}


# Tokenizer processes per GPU: one process tokenizes about 340,000 tokens/s with a
# 250,000-piece unigram vocabulary (XLM-R's, BGE-M3's; 0.68 of a 32,000-piece one's rate),
# and one H200 embeds BGE-M3 at 450,000-650,000: four leave a margin of two.
TOKENIZERS_PER_GPU = 4


def default_tokenize_workers(devices: Sequence[str]) -> int:
    """Tokenizer processes to start: one for CPUs (a fast tokenizer keeps up with a CPU
    model on one core); for GPUs `TOKENIZERS_PER_GPU` per GPU, within the cores left once
    the run's process and one process per GPU have theirs, and at least one."""
    if all(device == "cpu" for device in devices):
        return 1
    cores = os.cpu_count() or 1
    return max(1, min(cores - 1 - len(devices), TOKENIZERS_PER_GPU * len(devices)))

"""The choices a setting takes (enums, `--shard`), the defaults, and the number of
tokenizer processes a run starts."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from bulkembed.errors import UsageError

DEFAULT_MAX_BATCH_TOKENS = 16384
# Records per unit of work in JSON lines, Arrow and dataset inputs (a Parquet unit is a
# row group): the granularity of parts and of resume.
DEFAULT_RECORDS_PER_UNIT = 4096
# Pillow's own decompression-bomb limit: larger images are set aside (`--max-image-pixels`).
DEFAULT_MAX_IMAGE_PIXELS = 178_956_970
# What an incremental run may delete at most (`--max-deletes`): a tenth of the previous
# output's rows.
DEFAULT_MAX_DELETES = 0.1
OUTPUTS = ("dense", "sparse", "multivector")
# Column names the output uses for itself (`vector` is the dense column in LanceDB).
RESERVED_COLUMNS = ("id", *OUTPUTS, "content_hash", "vector")


class Pooling(str, Enum):
    """How token vectors become one dense vector."""

    CLS = "cls"
    MEAN = "mean"
    LAST_TOKEN = "last-token"


class DType(str, Enum):
    """Compute precision of the model. `auto` is bfloat16 or float16 on CUDA, bfloat16 on
    CPUs with bfloat16 units, else int8-weights where the model can run it, else float32
    (see `bulkembed.models.devices.dtype_choice`, `bulkembed.encoders.int8.int8_mode`).
    `int8-weights` and `int8` (weights and activations) run on the CPU, behind a check
    against float32 (`bulkembed.engine.int8_check`)."""

    AUTO = "auto"
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    INT8_WEIGHTS = "int8-weights"
    INT8 = "int8"


def refuse_int8_in_process(dtype: DType) -> None:
    """Texts embedded in-process (`bulkembed.load`) run in a float dtype: an int8 one is
    checked on a run's corpus, which they have none of."""
    if dtype in (DType.INT8, DType.INT8_WEIGHTS):
        raise UsageError(
            f"dtype={dtype.value!r} is checked on a run's corpus: embed texts here with "
            "dtype='auto' or 'float32' (the int8 vectors of a --dtype auto run agree with "
            "float32 ones at cosine 0.995 and more)"
        )


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

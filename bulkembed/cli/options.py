"""The options of `bulkembed run`, each defined once: its type, flag and help."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bulkembed.config import (
    Attention,
    Backend,
    DType,
    DTypeOut,
    Engine,
    IndexType,
    OnBadRecord,
    Pooling,
    Quantize,
    StreamFormat,
)
from bulkembed.errors import UsageError

ENV_PREFIX = "BULKEMBED_"


def _from_env(name: str) -> dict[str, Any]:
    """Settings that let an option also come from `BULKEMBED_<NAME>` (a flag given on the
    command line wins), shown in `--help`."""
    return {"envvar": f"{ENV_PREFIX}{name}", "show_envvar": True}


Inputs = Annotated[
    list[str],
    typer.Argument(
        help="Files, directories (searched recursively) or globs: .parquet, .jsonl, "
        ".jsonl.gz, .json (JSON lines), .arrow (folders made by datasets' save_to_disk); "
        "or hf://NAME, hf://NAME/CONFIG, hf://NAME/CONFIG:SPLIT: a Hugging Face dataset, "
        "streamed; or - for JSON lines on stdin (ids -:ROW without an id field; not "
        "resumable).",
        metavar="INPUT...",
        show_default=False,
    ),
]
Model = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="A recipe name (see `bulkembed recipes`), a hub id or a local folder.",
        **_from_env("MODEL"),
    ),
]
Output = Annotated[
    str,
    typer.Option(
        "--output",
        "-o",
        help="A directory (Parquet parts), lancedb://PATH or lancedb://PATH?table=NAME (a "
        "LanceDB table; "
        "needs bulkembed[lance]), or - (records on stdout, logs on stderr; a stream is "
        "not resumable: an interrupted run starts over).",
        **_from_env("OUTPUT"),
    ),
]
Recipe = Annotated[
    str | None,
    typer.Option(
        help="Apply this recipe's settings to the weights named by --model.", **_from_env("RECIPE")
    ),
]
Revision = Annotated[
    str | None, typer.Option(help="Hub revision (branch, tag or commit).", **_from_env("REVISION"))
]
TextColumn = Annotated[
    str, typer.Option(help="Column or JSON field holding the text.", **_from_env("TEXT_COLUMN"))
]
IdColumn = Annotated[
    str | None,
    typer.Option(
        help="Column or JSON field holding the document id. Default: 'id' if present, "
        "else 'SHARD:ROW' (the file's path relative to its input, and the record's position).",
        **_from_env("ID_COLUMN"),
    ),
]
MaxBatchTokens = Annotated[
    str | None,
    typer.Option(
        help="Token budget per batch (longest × count; the sum of lengths for flat "
        "batches), or auto: on CUDA, probe the free memory once at start and fill 70% of it "
        "(the default elsewhere). Default: the recipe's, else 16384.",
        **_from_env("MAX_BATCH_TOKENS"),
    ),
]
Compile = Annotated[
    bool,
    typer.Option(
        "--compile",
        help="Compile the model with torch.compile (any batch shape): slower start, "
        "often faster on GPUs; measure before keeping it.",
        **_from_env("COMPILE"),
    ),
]
BackendOption = Annotated[
    Backend,
    typer.Option(
        "--backend",
        help="What runs the model. auto: OpenVINO on a CPU for BERT, RoBERTa and "
        "XLM-RoBERTa models (converted once and cached), else PyTorch. openvino: CPU only, "
        "float32 or bfloat16. torch: PyTorch eager (or --compile).",
        **_from_env("BACKEND"),
    ),
]
AttentionOption = Annotated[
    Attention,
    typer.Option(
        "--attention",
        help="How batches run. flat: documents end to end, no padding, attention within "
        "each (BERT, RoBERTa, XLM-RoBERTa; PyTorch). padded: padded to the longest, with a "
        "mask. auto: flat on CUDA where a variable-length kernel runs the dtype, else padded.",
        **_from_env("ATTENTION"),
    ),
]
MaxLength = Annotated[
    int | None,
    typer.Option(
        help="Truncate documents to this many tokens. Default: the model's.",
        **_from_env("MAX_LENGTH"),
    ),
]
TokenizeWorkers = Annotated[
    int | None,
    typer.Option(
        help="Tokenizer processes (0: in the main process). Default: 1 on CPU, "
        "all cores but two on CUDA.",
        **_from_env("TOKENIZE_WORKERS"),
    ),
]
Devices = Annotated[
    str,
    typer.Option(
        help="auto (every GPU, else the CPU), cpu, cuda, cuda:N, or a comma-separated list "
        "(cuda:0,cuda:1; cpu,cpu): one encoder process per entry, fed from one queue.",
        **_from_env("DEVICES"),
    ),
]
DTypeOption = Annotated[
    DType,
    typer.Option(
        "--dtype",
        help="Compute precision. auto: on CUDA bfloat16 on devices that have it (compute "
        "capability 8.0 on), else float16; on CPU bfloat16 where the CPU has bfloat16 "
        "units (AMX, AVX512-BF16), else float32. A half-precision auto choice is checked "
        "against float32 on the first 64 documents and dropped, with a warning, below "
        "cosine 0.9999 (every dense vector; 99% of multi-vector and sparse ones).",
        **_from_env("DTYPE"),
    ),
]
PoolingOption = Annotated[
    Pooling | None,
    typer.Option(
        "--pooling", help="Override the pooling of the model or recipe.", **_from_env("POOLING")
    ),
]
Normalize = Annotated[
    bool | None,
    typer.Option(
        "--normalize/--no-normalize",
        help="L2-normalize vectors. Default: as the model says.",
        **_from_env("NORMALIZE"),
    ),
]
Prompt = Annotated[
    str | None,
    typer.Option(
        help="Text put before every document (counts toward max length).", **_from_env("PROMPT")
    ),
]
PromptName = Annotated[
    str | None,
    typer.Option(
        help="Use the model's or recipe's prompt of this name.", **_from_env("PROMPT_NAME")
    ),
]
Limit = Annotated[
    int | None, typer.Option(help="Embed only the first N documents.", **_from_env("LIMIT"))
]
Outputs = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated: dense, sparse, multivector. Default: all the model produces "
        "(or the recipe's list).",
        **_from_env("OUTPUTS"),
    ),
]
Dim = Annotated[
    int | None,
    typer.Option(
        help="Cut dense vectors to their first N dimensions (Matryoshka), then L2-normalize "
        "them again if the model normalizes.",
        **_from_env("DIM"),
    ),
]
DTypeOutOption = Annotated[
    DTypeOut,
    typer.Option(
        "--dtype-out",
        help="Float type of the dense and multi-vector columns.",
        **_from_env("DTYPE_OUT"),
    ),
]
QuantizeOption = Annotated[
    Quantize | None,
    typer.Option(
        help="Write dense vectors as int8, uint8 (ranges calibrated once per run), binary or "
        "ubinary (1 bit per dimension).",
        **_from_env("QUANTIZE"),
    ),
]
SparseTopK = Annotated[
    int | None,
    typer.Option(
        help="Keep only the K largest weights of each SPLADE vector.", **_from_env("SPARSE_TOP_K")
    ),
]
OnBadRecordOption = Annotated[
    OnBadRecord,
    typer.Option(
        "--on-bad-record",
        help="skip: set bad records aside in _bulkembed/bad_records.jsonl and go on; "
        "fail: stop at the first one.",
        **_from_env("ON_BAD_RECORD"),
    ),
]
MaxBadRecords = Annotated[
    str | None,
    typer.Option(
        help="Exit with status 3 once the run has finished if it set aside more bad records "
        "than this: a count (25) or a fraction of the records read (0.01 for 1%). Default: "
        "no limit.",
        metavar="N",
        **_from_env("MAX_BAD_RECORDS"),
    ),
]
Overwrite = Annotated[
    bool,
    typer.Option(
        "--overwrite",
        help="Start over in an output that holds an earlier run (by default a run with the "
        "same settings is resumed, and one with other settings is refused).",
        **_from_env("OVERWRITE"),
    ),
]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="Print nothing but errors and warnings.", **_from_env("QUIET")
    ),
]
KeepColumns = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated input columns (or JSON fields) to copy into the output, "
        "e.g. title,url.",
        **_from_env("KEEP_COLUMNS"),
    ),
]
StreamFormatOption = Annotated[
    StreamFormat | None,
    typer.Option(
        "--stream-format",
        help="With --output -: jsonl (one JSON object per line, the default) or arrow "
        "(an Arrow IPC stream).",
        **_from_env("STREAM_FORMAT"),
    ),
]
Index = Annotated[
    bool,
    typer.Option(
        "--index",
        help="LanceDB: build vector indexes on vector and multivector once all rows are in.",
        **_from_env("INDEX"),
    ),
]
IndexTypeOption = Annotated[
    IndexType,
    typer.Option(
        help="auto (IVF_HNSW_SQ below 1M rows, IVF_PQ from 1M), ivf_pq, ivf_hnsw_sq or ivf_flat.",
        **_from_env("INDEX_TYPE"),
    ),
]
IndexPartitions = Annotated[
    int | None,
    typer.Option(
        help="IVF partitions. Default: from the row count (about its square root for "
        "IVF_PQ and IVF_FLAT, one per million rows for IVF_HNSW_SQ).",
        **_from_env("INDEX_PARTITIONS"),
    ),
]
Fts = Annotated[
    bool,
    typer.Option(
        "--fts",
        help="LanceDB: build a full-text index on the text column (keep it with --keep-columns).",
        **_from_env("FTS"),
    ),
]
Since = Annotated[
    str | None,
    typer.Option(
        help="An earlier output directory made with the same settings: copy the vectors of "
        "documents whose id and text are unchanged, embed only new and changed ones. The "
        "--output LanceDB table itself: update it in place.",
        metavar="PREVIOUS_OUT",
        **_from_env("SINCE"),
    ),
]
MaxDeletes = Annotated[
    str,
    typer.Option(
        help="With --since: delete at most this many of the previous output's ids gone "
        "from the input: a count (500), a fraction of its rows (0.25), or all. Over it the "
        "run writes its new and changed documents, deletes nothing and exits with status 4.",
        metavar="N",
        **_from_env("MAX_DELETES"),
    ),
]
VerifyInputs = Annotated[
    bool,
    typer.Option(
        "--verify-inputs",
        help="Record a digest of each input's content, and on resume compare contents "
        "instead of modification times (reads every input once at start). Without it an "
        "input counts as unchanged while its name, size and modification time are.",
        **_from_env("VERIFY_INPUTS"),
    ),
]
RecordsPerUnit = Annotated[
    int,
    typer.Option(
        help="Records per unit of work in JSON lines, Arrow and dataset inputs (a Parquet "
        "unit is one row group): a unit is one output part and the step of resume.",
        metavar="N",
        **_from_env("RECORDS_PER_UNIT"),
    ),
]

ShardOption = Annotated[
    str | None,
    typer.Option(
        "--shard",
        help="I/N: take only the units of work whose index is I modulo N, so that N runs (a "
        "job array) share one output directory; together they write what one run would.",
        metavar="I/N",
        **_from_env("SHARD"),
    ),
]
EngineOption = Annotated[
    Engine,
    typer.Option(
        help="local (this machine's processes) or ray (Ray Data tasks and actors on a "
        "cluster; needs bulkembed[ray]).",
        **_from_env("ENGINE"),
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        help="The Ray cluster to join. Default: auto (RAY_ADDRESS or a running local "
        "cluster), else a new local instance.",
        **_from_env("RAY_ADDRESS"),
    ),
]
StorageOption = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        help="KEY=VALUE for object storage (repeat it): endpoint=URL, region=NAME, "
        "anonymous=true, project=ID (GCS), account=NAME (Azure). Credentials come from each "
        "cloud's environment variables and config files.",
        metavar="KEY=VALUE",
        **_from_env("STORAGE_OPTION"),
    ),
]
BreakLock = Annotated[
    bool,
    typer.Option(
        "--break-lock",
        help="Take over the output's lease on object storage even if it has not expired "
        "(only when the run that held it is known to be dead).",
        **_from_env("BREAK_LOCK"),
    ),
]


def batch_tokens(text: str | None) -> int | None:
    """`--max-batch-tokens` as a number; None for the default or `auto`."""
    if text is None or text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise UsageError(
            f"--max-batch-tokens {text}: expected a number of tokens or auto"
        ) from None

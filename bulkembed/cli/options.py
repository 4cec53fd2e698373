"""The options of `bulkembed run`, each defined once: its type, flag and help."""

from __future__ import annotations

from typing import Annotated

import typer

from bulkembed.config import (
    DType,
    DTypeOut,
    Engine,
    IndexType,
    OnBadRecord,
    Pooling,
    Quantize,
    StreamFormat,
)

Inputs = Annotated[
    list[str],
    typer.Argument(
        help="Files, directories (searched recursively) or globs: .parquet, .jsonl, "
        ".jsonl.gz, .json (JSON lines), .arrow (folders made by datasets' save_to_disk); "
        "or hf://NAME, hf://NAME/CONFIG, hf://NAME/CONFIG:SPLIT: a Hugging Face dataset, "
        "streamed.",
        metavar="INPUT...",
        show_default=False,
    ),
]
Model = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="A recipe name (see `bulkembed recipes`), a hub id or a local folder."
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
    ),
]
Recipe = Annotated[
    str | None,
    typer.Option(help="Apply this recipe's settings to the weights named by --model."),
]
Revision = Annotated[str | None, typer.Option(help="Hub revision (branch, tag or commit).")]
TextColumn = Annotated[str, typer.Option(help="Column or JSON field holding the text.")]
IdColumn = Annotated[
    str | None,
    typer.Option(
        help="Column or JSON field holding the document id. Default: 'id' if present, "
        "else 'SHARD:ROW' (the file's path relative to its input, and the record's position)."
    ),
]
MaxBatchTokens = Annotated[
    str | None,
    typer.Option(
        help="Token budget per batch (longest × count), or auto: on CUDA, probe the free "
        "memory once at start and fill 70% of it (the default elsewhere). Default: the "
        "recipe's, else 16384."
    ),
]
Compile = Annotated[
    bool,
    typer.Option(
        "--compile",
        help="Compile the model with torch.compile (any batch shape): slower start, "
        "often faster on GPUs; measure before keeping it.",
    ),
]
MaxLength = Annotated[
    int | None, typer.Option(help="Truncate documents to this many tokens. Default: the model's.")
]
TokenizeWorkers = Annotated[
    int | None,
    typer.Option(
        help="Tokenizer processes (0: in the main process). Default: 1 on CPU, "
        "all cores but two on CUDA."
    ),
]
Devices = Annotated[
    str,
    typer.Option(
        help="auto (every GPU, else the CPU), cpu, cuda, cuda:N, or a comma-separated list "
        "(cuda:0,cuda:1; cpu,cpu): one encoder process per entry, fed from one queue."
    ),
]
DTypeOption = Annotated[
    DType,
    typer.Option(
        "--dtype",
        help="Compute precision. auto: on CUDA bfloat16 for models saved in bfloat16 on "
        "devices that have it, else float16; on CPU bfloat16 where the CPU has bfloat16 "
        "units (AMX, AVX512-BF16), else float32. A half-precision auto choice is checked "
        "against float32 on the first 64 documents and dropped, with a warning, below "
        "cosine 0.9999 (every dense vector; 99% of multi-vector and sparse ones).",
    ),
]
PoolingOption = Annotated[
    Pooling | None,
    typer.Option("--pooling", help="Override the pooling of the model or recipe."),
]
Normalize = Annotated[
    bool | None,
    typer.Option(
        "--normalize/--no-normalize", help="L2-normalize vectors. Default: as the model says."
    ),
]
Prompt = Annotated[
    str | None, typer.Option(help="Text put before every document (counts toward max length).")
]
PromptName = Annotated[
    str | None, typer.Option(help="Use the model's or recipe's prompt of this name.")
]
Limit = Annotated[int | None, typer.Option(help="Embed only the first N documents.")]
Outputs = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated: dense, sparse, multivector. Default: all the model produces "
        "(or the recipe's list)."
    ),
]
Dim = Annotated[
    int | None,
    typer.Option(
        help="Cut dense vectors to their first N dimensions (Matryoshka), then L2-normalize "
        "them again if the model normalizes."
    ),
]
DTypeOutOption = Annotated[
    DTypeOut,
    typer.Option("--dtype-out", help="Float type of the dense and multi-vector columns."),
]
QuantizeOption = Annotated[
    Quantize | None,
    typer.Option(
        help="Write dense vectors as int8, uint8 (ranges calibrated once per run), binary or "
        "ubinary (1 bit per dimension)."
    ),
]
SparseTopK = Annotated[
    int | None, typer.Option(help="Keep only the K largest weights of each SPLADE vector.")
]
OnBadRecordOption = Annotated[
    OnBadRecord,
    typer.Option(
        "--on-bad-record",
        help="skip: set bad records aside in _bulkembed/bad_records.jsonl and go on; "
        "fail: stop at the first one.",
    ),
]
Overwrite = Annotated[
    bool,
    typer.Option(
        "--overwrite",
        help="Start over in an output that holds an earlier run (by default a run with the "
        "same settings is resumed, and one with other settings is refused).",
    ),
]
Quiet = Annotated[
    bool, typer.Option("--quiet", "-q", help="Print nothing but errors and warnings.")
]
KeepColumns = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated input columns (or JSON fields) to copy into the output, "
        "e.g. title,url."
    ),
]
StreamFormatOption = Annotated[
    StreamFormat | None,
    typer.Option(
        "--stream-format",
        help="With --output -: jsonl (one JSON object per line, the default) or arrow "
        "(an Arrow IPC stream).",
    ),
]
Index = Annotated[
    bool,
    typer.Option(
        "--index",
        help="LanceDB: build vector indexes on vector and multivector once all rows are in.",
    ),
]
IndexTypeOption = Annotated[
    IndexType,
    typer.Option(
        help="auto (IVF_HNSW_SQ below 1M rows, IVF_PQ from 1M), ivf_pq, ivf_hnsw_sq or ivf_flat."
    ),
]
IndexPartitions = Annotated[
    int | None,
    typer.Option(
        help="IVF partitions. Default: from the row count (about its square root for "
        "IVF_PQ and IVF_FLAT, one per million rows for IVF_HNSW_SQ)."
    ),
]
Fts = Annotated[
    bool,
    typer.Option(
        "--fts",
        help="LanceDB: build a full-text index on the text column (keep it with --keep-columns).",
    ),
]
Since = Annotated[
    str | None,
    typer.Option(
        help="An earlier output directory made with the same settings: copy the vectors of "
        "documents whose id and text are unchanged, embed only new and changed ones. The "
        "--output LanceDB table itself: update it in place.",
        metavar="PREVIOUS_OUT",
    ),
]
VerifyInputs = Annotated[
    bool,
    typer.Option(
        "--verify-inputs",
        help="Record a digest of each input's content, and on resume compare contents "
        "instead of modification times (reads every input once at start). Without it an "
        "input counts as unchanged while its name, size and modification time are.",
    ),
]
RecordsPerUnit = Annotated[
    int,
    typer.Option(
        help="Records per unit of work in JSON lines, Arrow and dataset inputs (a Parquet "
        "unit is one row group): a unit is one output part and the step of resume.",
        metavar="N",
    ),
]

ShardOption = Annotated[
    str | None,
    typer.Option(
        "--shard",
        help="I/N: take only the units of work whose index is I modulo N, so that N runs (a "
        "job array) share one output directory; together they write what one run would.",
        metavar="I/N",
    ),
]
EngineOption = Annotated[
    Engine,
    typer.Option(
        help="local (this machine's processes) or ray (Ray Data tasks and actors on a "
        "cluster; needs bulkembed[ray])."
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        help="The Ray cluster to join. Default: auto (RAY_ADDRESS or a running local "
        "cluster), else a new local instance."
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
    ),
]
BreakLock = Annotated[
    bool,
    typer.Option(
        "--break-lock",
        help="Take over the output's lease on object storage even if it has not expired "
        "(only when the run that held it is known to be dead).",
    ),
]

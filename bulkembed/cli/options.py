"""The options of `bulkembed run`, each defined once: its type, flag and help."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bulkembed.config import (
    Engine,
    IndexType,
    OnBadRecord,
    StreamFormat,
)

ENV_PREFIX = "BULKEMBED_"


def from_env(name: str) -> dict[str, Any]:
    """Settings that let an option also come from `BULKEMBED_<NAME>` (a flag given on the
    command line wins), shown in `--help`."""
    return {"envvar": f"{ENV_PREFIX}{name}", "show_envvar": True}


Inputs = Annotated[
    list[str],
    typer.Argument(
        help="Files, directories (searched recursively) or globs: .parquet, .jsonl, "
        ".jsonl.gz, .json (JSON lines), .arrow, .csv, .tsv (.arrow also in folders made by "
        "datasets' save_to_disk; CSV and TSV with a header row, read as text); image files "
        "(.jpg, .jpeg, .png, .webp, .gif, .tif, .tiff, .bmp), each folder of them one input "
        "whose images are its records, and WebDataset shards (.tar), for a two-tower model; "
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
        **from_env("MODEL"),
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
        **from_env("OUTPUT"),
    ),
]
TextColumn = Annotated[
    str, typer.Option(help="Column or JSON field holding the text.", **from_env("TEXT_COLUMN"))
]
ImageColumn = Annotated[
    str | None,
    typer.Option(
        help="Column or JSON field holding images (bytes, a datasets Image, or paths relative "
        "to the file), embedded by a two-tower model (CLIP, SigLIP). Folders of image files "
        "need none.",
        **from_env("IMAGE_COLUMN"),
    ),
]
MaxImagePixels = Annotated[
    int,
    typer.Option(
        help="Images with more pixels are set aside as bad records (a decompression bomb).",
        **from_env("MAX_IMAGE_PIXELS"),
    ),
]
IdColumn = Annotated[
    str | None,
    typer.Option(
        help="Column or JSON field holding the document id. Default: 'id' if present, "
        "else 'SHARD:ROW' (the file's path relative to its input, and the record's position).",
        **from_env("ID_COLUMN"),
    ),
]
TokenizeWorkers = Annotated[
    int | None,
    typer.Option(
        help="Tokenizer processes (0: in the main process). Default: 1 on CPU, "
        "4 per GPU on CUDA (within the cores left after one per GPU and one for the run).",
        **from_env("TOKENIZE_WORKERS"),
    ),
]
Devices = Annotated[
    str,
    typer.Option(
        help="auto (every GPU, else the CPU), cpu, cuda, cuda:N, or a comma-separated list "
        "(cuda:0,cuda:1; cpu,cpu): one encoder process per entry, fed from one queue.",
        **from_env("DEVICES"),
    ),
]
Limit = Annotated[
    int | None, typer.Option(help="Embed only the first N documents.", **from_env("LIMIT"))
]
OnBadRecordOption = Annotated[
    OnBadRecord,
    typer.Option(
        "--on-bad-record",
        help="skip: set bad records aside in _bulkembed/bad_records.jsonl and go on; "
        "fail: stop at the first one.",
        **from_env("ON_BAD_RECORD"),
    ),
]
MaxBadRecords = Annotated[
    str | None,
    typer.Option(
        help="Exit with status 3 once the run has finished if it set aside more bad records "
        "than this: a count (25) or a fraction of the records read (0.01 for 1%). Default: "
        "no limit.",
        metavar="N",
        **from_env("MAX_BAD_RECORDS"),
    ),
]
Overwrite = Annotated[
    bool,
    typer.Option(
        "--overwrite",
        help="Start over in an output that holds an earlier run (by default a run with the "
        "same settings is resumed, and one with other settings is refused).",
        **from_env("OVERWRITE"),
    ),
]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="Print nothing but errors and warnings.", **from_env("QUIET")
    ),
]
KeepColumns = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated input columns (or JSON fields) to copy into the output, "
        "e.g. title,url.",
        **from_env("KEEP_COLUMNS"),
    ),
]
StreamFormatOption = Annotated[
    StreamFormat | None,
    typer.Option(
        "--stream-format",
        help="With --output -: jsonl (one JSON object per line, the default) or arrow "
        "(an Arrow IPC stream).",
        **from_env("STREAM_FORMAT"),
    ),
]
Index = Annotated[
    bool,
    typer.Option(
        "--index",
        help="LanceDB: build vector indexes on vector and multivector once all rows are in.",
        **from_env("INDEX"),
    ),
]
IndexTypeOption = Annotated[
    IndexType,
    typer.Option(
        help="auto (IVF_HNSW_SQ below 1M rows, IVF_PQ from 1M), ivf_pq, ivf_hnsw_sq or ivf_flat.",
        **from_env("INDEX_TYPE"),
    ),
]
IndexPartitions = Annotated[
    int | None,
    typer.Option(
        help="IVF partitions. Default: from the row count (about its square root for "
        "IVF_PQ and IVF_FLAT, one per million rows for IVF_HNSW_SQ).",
        **from_env("INDEX_PARTITIONS"),
    ),
]
Fts = Annotated[
    bool,
    typer.Option(
        "--fts",
        help="LanceDB: build a full-text index on the text column (keep it with --keep-columns).",
        **from_env("FTS"),
    ),
]
Since = Annotated[
    str | None,
    typer.Option(
        help="An earlier output directory made with the same settings: copy the vectors of "
        "documents whose id and text are unchanged, embed only new and changed ones. The "
        "--output LanceDB table itself: update it in place.",
        metavar="PREVIOUS_OUT",
        **from_env("SINCE"),
    ),
]
MaxDeletes = Annotated[
    str,
    typer.Option(
        help="With --since: delete at most this many of the previous output's ids gone "
        "from the input: a count (500), a fraction of its rows (0.25), or all. Over it the "
        "run writes its new and changed documents, deletes nothing and exits with status 4.",
        metavar="N",
        **from_env("MAX_DELETES"),
    ),
]
VerifyInputs = Annotated[
    bool,
    typer.Option(
        "--verify-inputs",
        help="Record a digest of each input's content, and on resume compare contents "
        "instead of modification times (reads every input once at start). Without it an "
        "input counts as unchanged while its name, size and modification time are.",
        **from_env("VERIFY_INPUTS"),
    ),
]
RecordsPerUnit = Annotated[
    int,
    typer.Option(
        help="Records per unit of work in JSON lines, Arrow and dataset inputs (a Parquet "
        "unit is one row group): a unit is one output part and the step of resume.",
        metavar="N",
        **from_env("RECORDS_PER_UNIT"),
    ),
]

ShardOption = Annotated[
    str | None,
    typer.Option(
        "--shard",
        help="I/N: take only the units of work whose index is I modulo N, so that N runs (a "
        "job array) share one output directory; together they write what one run would.",
        metavar="I/N",
        **from_env("SHARD"),
    ),
]
EngineOption = Annotated[
    Engine,
    typer.Option(
        help="local (this machine's processes) or ray (Ray Data tasks and actors on a "
        "cluster; needs bulkembed[ray]).",
        **from_env("ENGINE"),
    ),
]
MetricsPort = Annotated[
    int | None,
    typer.Option(
        help="Serve the run's Prometheus metrics on this port while it runs "
        "(http://HOST:PORT/metrics; needs bulkembed[metrics]).",
        min=0,
        max=65535,
        **from_env("METRICS_PORT"),
    ),
]
MetricsFile = Annotated[
    str | None,
    typer.Option(
        help="Write the run's Prometheus metrics to this file every 10 s and at the end, "
        "for node_exporter's textfile collector (needs bulkembed[metrics]).",
        **from_env("METRICS_FILE"),
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        help="The Ray cluster to join. Default: auto (RAY_ADDRESS or a running local "
        "cluster), else a new local instance.",
        **from_env("RAY_ADDRESS"),
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
        **from_env("STORAGE_OPTION"),
    ),
]
BreakLock = Annotated[
    bool,
    typer.Option(
        "--break-lock",
        help="Take over the output's lease on object storage even if it has not expired "
        "(only when the run that held it is known to be dead).",
        **from_env("BREAK_LOCK"),
    ),
]

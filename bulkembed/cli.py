"""The `bulkembed` command. Thin: options become a `RunConfig`, then one library call.

Importing this module must stay cheap: `bulkembed --help` never imports torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Annotated, Any

import typer

from bulkembed.config import (
    DEFAULT_RECORDS_PER_UNIT,
    DType,
    DTypeOut,
    Engine,
    IndexType,
    OnBadRecord,
    Pooling,
    Quantize,
    RunConfig,
    ShardSpec,
    StreamFormat,
    find_recipe,
    list_recipes,
)
from bulkembed.errors import BulkembedError, Interrupted, PipeClosed
from bulkembed.progress import print_error

# As for a process that SIGPIPE ended (128 + 13), without the abrupt death.
PIPE_CLOSED_EXIT = 141

app = typer.Typer(
    help="Turn a text corpus into embeddings, in bulk.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
recipes_app = typer.Typer(help="List the bundled model recipes, or show one.")
app.add_typer(recipes_app, name="recipes")

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
        help="Compute precision. auto: float16 on CUDA; on CPU bfloat16 where the CPU has "
        "bfloat16 units (AMX, AVX512-BF16), else float32. A half-precision auto choice is "
        "checked against float32 on the first 64 documents and dropped below cosine 0.9999.",
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
        "documents whose id and text are unchanged, embed only new and changed ones.",
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


def _guarded(action: Callable[[], Any]) -> Any:
    """Run `action`, turning known errors into one line on stderr and a non-zero exit."""
    try:
        return action()
    except Interrupted as e:
        print_error(str(e))
        raise typer.Exit(128 + e.signal_number) from e
    except PipeClosed as e:
        print_error(str(e))
        raise typer.Exit(PIPE_CLOSED_EXIT) from e
    except BulkembedError as e:
        if os.environ.get("BULKEMBED_DEBUG"):
            raise
        print_error(str(e))
        raise typer.Exit(1) from e
    except KeyboardInterrupt as e:
        print_error("interrupted")
        raise typer.Exit(130) from e
    except Exception as e:
        if os.environ.get("BULKEMBED_DEBUG"):
            raise
        kind = f"{type(e).__module__}.{type(e).__qualname__}".removeprefix("builtins.")
        print_error(f"{kind}: {e} (set BULKEMBED_DEBUG=1 for the traceback)")
        raise typer.Exit(1) from e


def _names(option: str | None) -> tuple[str, ...]:
    """A comma-separated option as a tuple of names."""
    return tuple(n.strip() for n in (option or "").split(",") if n.strip())


def _batch_tokens(text: str | None) -> int | None:
    """`--max-batch-tokens` as a number; None for the default or `auto`."""
    if text is None or text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise BulkembedError(
            f"--max-batch-tokens {text}: expected a number of tokens or auto"
        ) from None


@app.command()
def run(
    inputs: Inputs,
    model: Model,
    output: Output,
    recipe: Recipe = None,
    revision: Revision = None,
    text_column: TextColumn = "text",
    id_column: IdColumn = None,
    max_batch_tokens: MaxBatchTokens = None,
    max_length: MaxLength = None,
    tokenize_workers: TokenizeWorkers = None,
    devices: Devices = "auto",
    dtype: DTypeOption = DType.AUTO,
    compile_model: Compile = False,
    pooling: PoolingOption = None,
    normalize: Normalize = None,
    prompt: Prompt = None,
    prompt_name: PromptName = None,
    limit: Limit = None,
    outputs: Outputs = None,
    sparse_top_k: SparseTopK = None,
    dim: Dim = None,
    dtype_out: DTypeOutOption = DTypeOut.FLOAT32,
    quantize: QuantizeOption = None,
    on_bad_record: OnBadRecordOption = OnBadRecord.SKIP,
    overwrite: Overwrite = False,
    quiet: Quiet = False,
    keep_columns: KeepColumns = None,
    stream_format: StreamFormatOption = None,
    index: Index = False,
    index_type: IndexTypeOption = IndexType.AUTO,
    index_partitions: IndexPartitions = None,
    fts: Fts = False,
    since: Since = None,
    verify_inputs: VerifyInputs = False,
    records_per_unit: RecordsPerUnit = DEFAULT_RECORDS_PER_UNIT,
    shard: ShardOption = None,
    engine: EngineOption = Engine.LOCAL,
    ray_address: RayAddress = None,
) -> None:
    """Embed INPUTS with a model into Parquet parts, a LanceDB table or stdout.

    Running the same command again resumes an interrupted run where it stopped (not with
    --output -, which starts over)."""

    def action() -> None:
        from bulkembed.engine.run import embed_corpus
        from bulkembed.progress import make_reporter

        config = RunConfig(
            inputs=tuple(inputs),
            output=output,
            model=model,
            recipe=recipe,
            revision=revision,
            text_column=text_column,
            id_column=id_column,
            max_batch_tokens=_batch_tokens(max_batch_tokens),
            tune_batch_tokens=max_batch_tokens == "auto",
            max_length=max_length,
            tokenize_workers=tokenize_workers,
            devices=devices,
            dtype=dtype,
            compile=compile_model,
            pooling=pooling,
            normalize=normalize,
            prompt=prompt,
            prompt_name=prompt_name,
            limit=limit,
            outputs=_names(outputs) if outputs is not None else None,
            sparse_top_k=sparse_top_k,
            dim=dim,
            dtype_out=dtype_out,
            quantize=quantize,
            on_bad_record=on_bad_record,
            overwrite=overwrite,
            quiet=quiet,
            keep_columns=_names(keep_columns),
            stream_format=stream_format,
            index=index,
            index_type=index_type,
            index_partitions=index_partitions,
            fts=fts,
            since=since,
            verify_inputs=verify_inputs,
            records_per_unit=records_per_unit,
            shard=None if shard is None else ShardSpec.parse(shard),
            engine=engine,
            ray_address=ray_address,
        )
        embed_corpus(config, reporter=make_reporter(quiet))

    _guarded(action)


@app.command()
def status(
    output: Annotated[
        str,
        typer.Argument(
            help="The --output of a run: a directory or lancedb://PATH?table=NAME.",
            metavar="OUT",
        ),
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of a table.")
    ] = False,
) -> None:
    """Progress of a run: units done and pending, documents, bad records, lock."""

    def action() -> None:
        from bulkembed.checkpoint import RunDirectory, run_status
        from bulkembed.progress import print_status
        from bulkembed.sinks import LanceSink, ParquetSink, Sink, parse_output

        target = parse_output(output)
        if target.path is None or target.run_directory is None:
            raise BulkembedError("a stream (--output -) keeps no run directory to report on")
        run = RunDirectory(target.path, meta=target.run_directory, label=target.label)
        if target.kind == "parquet":
            sink: Sink = ParquetSink(target.path)
        else:
            sink = LanceSink(target.path, target.table or "")
        figures = run_status(run, sink)
        if as_json:
            typer.echo(json.dumps(figures))
        else:
            print_status(figures)

    _guarded(action)


@recipes_app.callback(invoke_without_command=True)
def recipes(context: typer.Context) -> None:
    """List the bundled recipes."""
    if context.invoked_subcommand is not None:
        return
    for item in _guarded(list_recipes):
        typer.echo(f"{item.name:<24} {item.model:<44} {item.description}")


@recipes_app.command("show")
def show_recipe(name: Annotated[str, typer.Argument(help="Recipe name.")]) -> None:
    """Print one recipe file."""

    def action() -> str:
        found = find_recipe(name)
        if found is None or found.path is None:
            raise BulkembedError(f"unknown recipe '{name}': see `bulkembed recipes`")
        return found.path.read_text(encoding="utf-8")

    typer.echo(_guarded(action), nl=False)


def main() -> None:
    """Console-script entry point."""
    app()

"""The `bulkembed` command. Thin: options become a `RunConfig`, then one library call.

Importing this module must stay cheap: `bulkembed --help` never imports torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from bulkembed.cli.embed import embed_command
from bulkembed.cli.model_options import ModelOptions, with_group
from bulkembed.cli.options import Inputs, Model, Output, StorageOption
from bulkembed.cli.run_options import ExecutionOptions, InputOptions, OutputOptions
from bulkembed.config import RunConfig
from bulkembed.errors import (
    BulkembedError,
    ExitCode,
    Interrupted,
    PipeClosed,
    TooManyBadRecords,
    UsageError,
    one_line,
)
from bulkembed.models.recipes import find_recipe, list_recipes
from bulkembed.reporting.printing import print_error

app = typer.Typer(
    help="Turn a text corpus into embeddings, in bulk.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    rich_markup_mode=None,
)
recipes_app = typer.Typer(help="List the bundled model recipes, or show one.")
app.add_typer(recipes_app, name="recipes")


def _guarded(action: Callable[[], Any]) -> Any:
    """Run `action`, turning known errors into one line on stderr and the exit status of
    their class (`ExitCode`)."""
    try:
        return action()
    except (Interrupted, PipeClosed, TooManyBadRecords) as e:
        print_error(str(e))
        raise typer.Exit(e.exit_code) from e
    except BulkembedError as e:
        if os.environ.get("BULKEMBED_DEBUG"):
            raise
        print_error(str(e))
        raise typer.Exit(e.exit_code) from e
    except KeyboardInterrupt as e:
        print_error("interrupted")
        raise typer.Exit(ExitCode.INTERRUPTED) from e
    except Exception as e:
        if os.environ.get("BULKEMBED_DEBUG"):
            raise
        print_error(f"{one_line(e)} (set BULKEMBED_DEBUG=1 for the traceback)")
        raise typer.Exit(ExitCode.FAILED) from e


EXIT_STATUS_HELP = """Exit status: 0 done; 1 the run failed (model, output, a worker, an
unexpected error); 2 usage error (an option, a recipe or an input path); 3 finished, with
more bad records than --max-bad-records (nothing deleted); 4 finished without deleting: more
deletes than --max-deletes; 75 the output is in use by another run (retry later); 130 or
143 stopped by SIGINT or SIGTERM (run the same command to resume); 141 the reader of
--output - closed the pipe."""


def _print_version(value: bool) -> None:
    """`--version`: print `bulkembed X.Y.Z` and exit, before any command runs."""
    if value:
        from bulkembed.version import __version__

        typer.echo(f"bulkembed {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Turn a text corpus into embeddings, in bulk."""


@app.command(epilog=EXIT_STATUS_HELP)
@with_group(ModelOptions, "model_options")
@with_group(InputOptions, "input_options")
@with_group(OutputOptions, "output_options")
@with_group(ExecutionOptions, "execution")
def run(
    inputs: Inputs,
    model: Model,
    output: Output,
    model_options: ModelOptions,
    input_options: InputOptions,
    output_options: OutputOptions,
    execution: ExecutionOptions,
) -> None:
    """Embed INPUTS with a model into Parquet parts, a LanceDB table or stdout.

    Running the same command again resumes an interrupted run where it stopped (not with
    --output -, which starts over)."""

    def action() -> None:
        from bulkembed.engine.run import embed_corpus
        from bulkembed.reporting.progress import make_reporter

        groups = (model_options, input_options, output_options, execution)
        settings = {k: v for group in groups for k, v in group.settings().items()}
        config = RunConfig(inputs=tuple(inputs), output=output, model=model, **settings)
        embed_corpus(config, reporter=make_reporter(execution.quiet))

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
    storage_option: StorageOption = None,
) -> None:
    """Progress of a run: its state, units done and pending, documents (done, saved by an
    interrupted run, remaining), bad records, lock. Exits with the state's status: 0
    complete; 1 failed; 3 or 4 finished without deleting (over --max-bad-records or
    --max-deletes); 5 stopped (run the command again); 65 damaged; 66 missing or
    not-started (no run there); 75 running."""

    def action() -> int:
        from bulkembed.engine.sync import latest_run
        from bulkembed.reporting.printing import print_status
        from bulkembed.run_dir.status import exit_status, run_status
        from bulkembed.sinks import parse_output
        from bulkembed.storage import StorageOptions

        options = StorageOptions.parse(storage_option or [])
        target = parse_output(output, options)
        run, sink = latest_run(target)
        figures = {**run_status(run, sink, options), "output": target.label}
        if as_json:
            typer.echo(json.dumps(figures))
        else:
            print_status(figures)
        return exit_status(figures)

    code = _guarded(action)
    if code:
        raise typer.Exit(code)


@app.command()
def report(
    output: Annotated[
        str,
        typer.Argument(
            help="The --output of a run: a directory or lancedb://PATH?table=NAME.",
            metavar="OUT",
        ),
    ],
    to: Annotated[
        str | None,
        typer.Option(help="Write the page here. Default: report.html in the run directory."),
    ] = None,
    storage_option: StorageOption = None,
) -> None:
    """Write one self-contained HTML page about a run, from its run directory: tokens per
    second over time, document lengths, padding, stage seconds, device idle, bad records
    by reason, the encoder and the run's figures."""

    def action() -> str:
        from bulkembed.reporting.report import write_report
        from bulkembed.sinks import parse_output
        from bulkembed.storage import StorageOptions

        options = StorageOptions.parse(storage_option or [])
        written = write_report(parse_output(output, options), None if to is None else Path(to))
        return f"report: {written}"

    typer.echo(_guarded(action))


@recipes_app.callback(invoke_without_command=True)
def recipes(
    context: typer.Context,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
) -> None:
    """List the bundled recipes: name, hub id, whether the weights are in the Hugging Face
    cache (`bulkembed pull RECIPE` downloads them), description."""
    if context.invoked_subcommand is not None:
        return

    def action() -> list[dict[str, Any]]:
        from bulkembed.models.hub import cached_snapshot

        listed = []
        for item in list_recipes():
            cached = cached_snapshot(item.model, item.revision)
            listed.append(
                {
                    "name": item.name,
                    "model": item.model,
                    "cached": None if cached is None else str(cached),
                    "description": item.description,
                }
            )
        return listed

    listed = _guarded(action)
    if as_json:
        typer.echo(json.dumps(listed))
        return
    for item in listed:
        cached = "cached" if item["cached"] else "-"
        typer.echo(f"{item['name']:<24} {item['model']:<44} {cached:<7} {item['description']}")
    from huggingface_hub.constants import HF_HUB_CACHE

    typer.echo(f"cached: in {HF_HUB_CACHE} (bulkembed pull RECIPE downloads one)")


@recipes_app.command("show")
def show_recipe(name: Annotated[str, typer.Argument(help="Recipe name.")]) -> None:
    """Print one recipe file."""

    def action() -> str:
        from bulkembed.models.hub import did_you_mean

        found = find_recipe(name)
        if found is None or found.path is None:
            raise UsageError(
                f"unknown recipe '{name}': see `bulkembed recipes`{did_you_mean(name)}"
            )
        return found.path.read_text(encoding="utf-8")

    typer.echo(_guarded(action), nl=False)


@app.command()
def pull(
    name: Annotated[
        str, typer.Argument(help="A recipe (all-minilm-l6-v2) or a hub id (BAAI/bge-m3).")
    ],
    revision: Annotated[
        str | None,
        typer.Option(
            help="A branch, tag or commit of the model (default: the recipe's, else main)."
        ),
    ] = None,
) -> None:
    """Download what a run reads of a model (configuration, tokenizer, weights) into the
    Hugging Face cache, for later runs without the network (HF_HUB_OFFLINE=1). Where the
    Hub cannot be reached, say whether the cache holds it already."""

    def action() -> str:
        from bulkembed.models.hub import pull as pull_model

        repository, _, folder = pull_model(name, revision)
        what = name if repository == name else f"{name} ({repository})"
        return f"{what} is in {folder}"

    typer.echo(_guarded(action))


app.command("embed")(embed_command(_guarded))


def main() -> None:
    """Console-script entry point."""
    app()

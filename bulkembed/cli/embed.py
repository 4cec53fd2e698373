"""`bulkembed embed`: a few texts (or images, with a two-tower model) embedded in this
process, one JSON line each, or the dense matrix as a `.npy` file. The model options are
`bulkembed run`'s."""

from __future__ import annotations

import os
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bulkembed.cli.model_options import ModelOptions, with_group
from bulkembed.cli.options import from_env
from bulkembed.errors import OutputError, UsageError

if TYPE_CHECKING:
    from bulkembed.contracts import Embeddings


class EmbedFormat(str, Enum):
    """What `bulkembed embed` writes."""

    JSON = "json"
    NPY = "npy"


Texts = Annotated[
    list[str] | None,
    typer.Argument(
        help="The texts to embed, one argument each.", metavar="[TEXT]...", show_default=False
    ),
]
Images = Annotated[
    list[str] | None,
    typer.Option(
        "--image",
        help="An image file to embed instead of texts (repeat the option for more), with a "
        "two-tower model (CLIP, SigLIP): turned upright by its EXIF orientation, as a run "
        "turns it.",
        show_default=False,
    ),
]
Query = Annotated[
    bool,
    typer.Option(
        "--query",
        help="Embed the texts as queries: the model's query prompt first (E5's 'query: ', "
        "the BGE instruction). Default: as documents, with the prompt `run` gives them.",
    ),
]
Format = Annotated[
    EmbedFormat,
    typer.Option(
        "--format",
        help="json: one JSON line per text on stdout (or --output), each output the model "
        "gives as a key: dense (a list), sparse ({indices, values}), multivector (a list "
        "of lists); npy: the dense matrix, one row per text, into --output.",
    ),
]
EmbedOutput = Annotated[
    str | None,
    typer.Option(
        "--output", "-o", help="The file to write, or - for stdout. Default for json: stdout."
    ),
]
EmbedDevices = Annotated[
    str,
    typer.Option(
        "--devices",
        help="auto (the first GPU, else the CPU), cpu, cuda or cuda:N; a comma-separated "
        "list starts one encoder process per entry.",
    ),
]
EmbedModel = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="A recipe name (see `bulkembed recipes`), a hub id or a local folder; with "
        "--like, where the model it names is now, if it moved.",
        **from_env("MODEL"),
    ),
]
Like = Annotated[
    str | None,
    typer.Option(
        "--like",
        help="An output `bulkembed run` wrote (a folder, lancedb://PATH?table=NAME, "
        "s3://...): embed with the model and the settings its vectors were made with, read "
        "from it. Options that shape a vector are refused with it.",
        show_default=False,
    ),
]
Replace = Annotated[
    bool, typer.Option("--overwrite", help="Replace the --output file if it exists.")
]


def embed_command(guarded: Callable[[Callable[[], Any]], Any]) -> Callable[..., None]:
    """The `embed` command, whose errors `guarded` turns into the CLI's one-line errors and
    exit codes."""

    @with_group(ModelOptions, "model_options")
    def embed(
        model_options: ModelOptions,
        texts: Texts = None,
        image: Images = None,
        model: EmbedModel = None,
        like: Like = None,
        query: Query = False,
        output_format: Format = EmbedFormat.JSON,
        output: EmbedOutput = None,
        overwrite: Replace = False,
        devices: EmbedDevices = "auto",
    ) -> None:
        """Embed TEXT... (or --image PATH...) with a model in this process: one JSON line
        per text or image, in order.

        The vectors are those `bulkembed run` writes for the same texts or images and
        options."""

        def action() -> None:
            from bulkembed.api import load

            prompted = (model_options.prompt, model_options.prompt_name) != (None, None)
            if query and prompted:
                raise UsageError(
                    "--query applies the model's query prompt: leave out --prompt and --prompt-name"
                )
            if bool(texts) == bool(image):
                raise UsageError("pass the texts to embed, or --image PATH for images: one of them")
            if image and query:
                raise UsageError("--query embeds texts as queries: leave it out with --image")
            _check_arguments(texts or [])
            target = None if output == "-" else output
            if output_format is EmbedFormat.NPY and output is None:
                raise UsageError("--format npy writes a file: pass --output FILE.npy (or -)")
            if target is not None:
                _check_output(target, overwrite)
            settings = model_options.settings()
            if like is not None:
                from bulkembed.output.recorded import names_output

                if not names_output(like):
                    raise UsageError(
                        f"--like {like} is not an output bulkembed wrote (it has no "
                        "_bulkembed/config.json): name one, or pass --model for a model"
                    )
                source, settings = like, _given(settings)
                if model is not None:
                    settings["model"] = model
            elif model is None:
                raise UsageError("pass --model MODEL, or --like OUTPUT to embed as an output was")
            else:
                source = model
            with load(source, **settings, devices=devices) as encoder:
                if image:
                    found = encoder.encode_images(image)
                else:
                    listed = texts or []
                    found = encoder.encode_query(listed) if query else encoder.encode(listed)
            _write(found, len(texts or image or []), output_format, target)

        guarded(action)

    return embed


def _given(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings of the options given: those that say where and how fast the model runs
    always, the others where they are not left at their defaults."""
    from bulkembed.config import RUNTIME_SETTINGS, DTypeOut

    return {
        name: value
        for name, value in settings.items()
        if name in RUNTIME_SETTINGS or (value is not None and value != DTypeOut.FLOAT32)
    }


def _check_arguments(texts: list[str]) -> None:
    """Refuse a TEXT argument that is not valid UTF-8 (Python keeps its bytes as lone
    surrogates)."""
    for number, text in enumerate(texts, start=1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raw = text.encode("utf-8", "surrogateescape")
            position = len(text[: e.start].encode("utf-8", "surrogateescape"))
            raise UsageError(
                f"TEXT {number} is not valid UTF-8 (byte 0x{raw[position]:02x} at byte "
                f"{position}): pass UTF-8 text"
            ) from None


def _write(found: Embeddings, count: int, output_format: EmbedFormat, output: str | None) -> None:
    """The `count` texts' embeddings into `output` (None: stdout), as `output_format` says."""
    if output_format is EmbedFormat.NPY:
        _write_npy(found, output)
    elif output is None:
        for line in json_lines(found, count):
            typer.echo(line)
    else:
        lines = "".join(line + "\n" for line in json_lines(found, count))
        _write_file(output, lines.encode("utf-8"))


def _check_output(output: str, overwrite: bool) -> None:
    """Refuse, before the model loads, an `--output` file that cannot be written."""
    if os.path.isdir(output):
        raise OutputError(f"--output {output} is a directory: name a file in it")
    folder = os.path.dirname(output) or "."
    if not os.path.isdir(folder):
        raise OutputError(f"--output {output}: the folder {folder} does not exist; create it")
    if os.path.exists(output) and not overwrite:
        raise OutputError(f"{output} exists: pass --overwrite to replace it")


def _write_file(output: str, data: bytes) -> None:
    try:
        with open(output, "wb") as f:
            f.write(data)
    except OSError as e:
        raise OutputError(f"cannot write {output}: {e.strerror or e}") from e


def _write_npy(found: Embeddings, output: str | None) -> None:
    """The dense matrix into `output` (None: stdout), with numpy's `.npy` layout."""
    import io
    import sys

    import numpy as np

    if found.dense is None:
        raise UsageError("--format npy writes dense vectors: this model gives none")
    data = io.BytesIO()
    np.save(data, found.dense)
    if output is None:
        sys.stdout.buffer.write(data.getvalue())
        sys.stdout.buffer.flush()
    else:
        _write_file(output, data.getvalue())


def json_lines(found: Embeddings, count: int) -> list[str]:
    """One JSON object per text: `dense`, `sparse` ({indices, values}) and `multivector`,
    each when the model gives it, floats as the shortest text that reads back as the same
    float32."""
    import orjson

    rows: list[dict[str, Any]] = [{} for _ in range(count)]
    for number, row in enumerate(rows):
        if found.dense is not None:
            row["dense"] = found.dense[number]
        if found.sparse is not None:
            vector = found.sparse[number]
            row["sparse"] = {"indices": vector.indices, "values": vector.values}
        if found.multivector is not None:
            row["multivector"] = found.multivector[number]
    return [orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY).decode() for row in rows]

"""Write the option reference of `bulkembed run` into docs/reference.md, between the markers.

    python scripts/cli_reference.py          # rewrite the section
    python scripts/cli_reference.py --check  # exit 1 if it is out of date

The table is generated from the CLI's own options, so the reference cannot drift from them.
"""

from __future__ import annotations

import argparse
import enum
import inspect
import sys
import types
import typing
from pathlib import Path

import typer

from bulkembed.cli import run

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
START, END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"


def _kind(annotation: object) -> str:
    """The value type of an option, from its annotation (`X | None` shows as X)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return " \\| ".join(str(member.value) for member in annotation)
    if typing.get_origin(annotation) is list:
        return "paths"
    return getattr(annotation, "__name__", str(annotation))


def _row(name: str, hint: object, default: object) -> str:
    base, info = typing.get_args(hint)[:2]
    if isinstance(info, typer.models.ArgumentInfo):
        names = f"`{info.metavar or name.upper()}`"
    else:
        # With Annotated, typer takes a leading flag name in the `default` slot.
        leading = [info.default] if str(info.default).startswith("-") else []
        decls = [*leading, *info.param_decls] or [f"--{name.replace('_', '-')}"]
        names = ", ".join(f"`{d}`" for d in decls)
    if default is inspect.Parameter.empty:
        shown = "required"
    elif default is None or default is False:
        shown = ""
    else:
        shown = f"`{getattr(default, 'value', default)}`"
    text = (info.help or "").replace("|", "\\|")
    return f"| {names} | {_kind(base)} | {shown} | {text} |"


def reference() -> str:
    """A Markdown table of every argument and option of `bulkembed run`."""
    parameters = inspect.signature(run, eval_str=True).parameters.values()
    rows = [_row(p.name, p.annotation, p.default) for p in parameters]
    header = "| option | type | default | meaning |\n| --- | --- | --- | --- |"
    return "\n".join([header, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = REFERENCE.read_text(encoding="utf-8")
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    updated = f"{before}{START}\n{reference()}\n{END}{after}"
    if args.check:
        sys.exit(0 if updated == text else 1)
    REFERENCE.write_text(updated, encoding="utf-8")


if __name__ == "__main__":
    main()

"""Write the reference of every `bulkembed` command into docs/reference.md, each between
its markers (`<!-- cli-reference:COMMAND:start -->` and `:end -->`).

    python scripts/cli_reference.py          # rewrite the sections
    python scripts/cli_reference.py --check  # exit 1 if one is out of date

Each section is generated from the command's own docstring and options, so the reference
cannot drift from them.
"""

from __future__ import annotations

import argparse
import enum
import inspect
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path

import typer

from bulkembed.cli import app

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"


def _markers(command: str) -> tuple[str, str]:
    key = command.replace(" ", "-")
    return f"<!-- cli-reference:{key}:start -->", f"<!-- cli-reference:{key}:end -->"


def commands() -> dict[str, Callable[..., object]]:
    """Every command of the CLI by its words (`run`, `recipes show`), with its function."""
    found: dict[str, Callable[..., object]] = {}
    for info in app.registered_commands:
        assert info.callback is not None
        found[info.name or info.callback.__name__] = info.callback
    for group in app.registered_groups:
        typer_app = group.typer_instance
        assert typer_app is not None and group.name is not None
        callback = typer_app.registered_callback
        if callback is not None and callback.callback is not None:
            found[group.name] = callback.callback
        for info in typer_app.registered_commands:
            assert info.callback is not None
            found[f"{group.name} {info.name or info.callback.__name__}"] = info.callback
    return found


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


def reference(command: Callable[..., object]) -> str:
    """The command's docstring, then a Markdown table of its arguments and options."""
    parameters = [
        p
        for p in inspect.signature(command, eval_str=True).parameters.values()
        if typing.get_origin(p.annotation) is typing.Annotated
    ]
    rows = [_row(p.name, p.annotation, p.default) for p in parameters]
    about = inspect.cleandoc(command.__doc__ or "")
    if not rows:
        return about
    header = "| option | type | default | meaning |\n| --- | --- | --- | --- |"
    return "\n".join([about, "", header, *rows])


def updated(text: str) -> str:
    """`text` (the reference page) with every command's section generated anew."""
    for name, command in commands().items():
        start, end = _markers(name)
        if start not in text:
            raise SystemExit(f"docs/reference.md has no section for bulkembed {name}: add {start}")
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = f"{before}{start}\n{reference(command)}\n{end}{after}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = REFERENCE.read_text(encoding="utf-8")
    new = updated(text)
    if args.check:
        sys.exit(0 if new == text else 1)
    REFERENCE.write_text(new, encoding="utf-8")


if __name__ == "__main__":
    main()

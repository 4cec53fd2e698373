"""Input formats by registry: each format says its name and the suffixes of its files
(`InputFormat.name`, `suffixes`, `title`), and `register_format` makes it read. A file's
format is that of the longest suffix its name ends in; the errors that list what can be
read are made from the registry (`readable`).

A format of another file is added with `register_format(MyFormat())`; the built-in ones
(Parquet, JSON lines, Arrow, CSV/TSV, Hugging Face datasets) are registered by
`bulkembed.sources`. A registration holds in its own process: a process the run spawns
that reads inputs (a Ray actor) knows only the formats registered there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bulkembed.sources.base import InputFormat
    from bulkembed.sources.records import InputFile
    from bulkembed.storage import AnyPath

# Formats by name, and format names by suffix (lowercase, with its dot).
_FORMATS: dict[str, InputFormat] = {}
_SUFFIXES: dict[str, str] = {}


def register_format(fmt: InputFormat) -> None:
    """Read files of `fmt`'s suffixes as `fmt` (replacing a format of its name, and the
    claim of another format on those suffixes)."""
    former = _FORMATS.get(fmt.name)
    if former is not None:
        unregister_format(former)
    _FORMATS[fmt.name] = fmt
    for suffix in fmt.suffixes:
        _SUFFIXES[suffix.lower()] = fmt.name


def unregister_format(fmt: InputFormat) -> None:
    """Stop reading `fmt`'s files."""
    if _FORMATS.get(fmt.name) is fmt:
        del _FORMATS[fmt.name]
    for suffix in [s for s, name in _SUFFIXES.items() if name == fmt.name]:
        del _SUFFIXES[suffix]


def format_name(path: AnyPath, in_folder: bool = False) -> str | None:
    """The format of a file by its name (its longest registered suffix); None for a file
    that is no input, or, `in_folder` (found in an input directory rather than named or
    matched by a glob), of a format read only when named."""
    name = path.name.lower()
    found = [suffix for suffix in _SUFFIXES if name.endswith(suffix)]
    if not found:
        return None
    fmt = _SUFFIXES[max(found, key=len)]
    return fmt if _FORMATS[fmt].in_folders or not in_folder else None


def format_of(file: InputFile) -> InputFormat:
    """How `file` is read."""
    return _FORMATS[file.format]


def named_only() -> str:
    """The suffixes of the formats read only when named or matched by a glob."""
    return ", ".join(s for f in _FORMATS.values() if not f.in_folders for s in f.suffixes)


def readable(in_folders: bool = False) -> str:
    """The files that can be read, in words: each format's suffixes, by its title; with
    `in_folders`, those of the formats read from an input directory.

    >>> from bulkembed.sources import readable
    >>> readable()  # doctest: +NORMALIZE_WHITESPACE
    '.parquet, .jsonl, .jsonl.gz, .json (JSON lines), .arrow, .jpg, .jpeg, .png, .webp, .gif,
    .tif, .tiff, .bmp (images), .tar (WebDataset shards), .csv, .tsv'
    >>> readable(in_folders=True)  # doctest: +NORMALIZE_WHITESPACE
    '.parquet, .jsonl, .jsonl.gz, .json (JSON lines), .arrow, .jpg, .jpeg, .png, .webp, .gif,
    .tif, .tiff, .bmp (images), .tar (WebDataset shards)'
    """
    parts = []
    for fmt in _FORMATS.values():
        if fmt.suffixes and (fmt.in_folders or not in_folders):
            listed = ", ".join(fmt.suffixes)
            parts.append(f"{listed} ({fmt.title})" if fmt.title else listed)
    return ", ".join(parts)

"""Find input files, in a deterministic order, and count what they hold.

Inputs on object storage (`s3://`, `gs://`, `az://`) are found by one listing of their
prefix, and read through `bulkembed.storage`: from the start as a stream, or at an offset
through ranged requests. The input `-` is JSON lines on stdin, named `-` in ids."""

from __future__ import annotations

import fnmatch
import glob
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from bulkembed.contracts import RUN_DIRECTORY
from bulkembed.errors import InputError, UsageError
from bulkembed.sources.records import InputFile
from bulkembed.sources.registry import format_name, named_only, readable
from bulkembed.storage import (
    AnyPath,
    FileStatus,
    ObjectPath,
    StorageOptions,
    is_uri,
    location,
)

# The input read from stdin, and its name in ids (`-:ROW`).
STDIN = "-"

# What `datasets`' save_to_disk writes beside the Arrow files: metadata, not input.
DATASET_METADATA = ("state.json", "dataset_info.json", "dataset_dict.json")


def _unsupported(argument: str) -> UsageError:
    return UsageError(f"unsupported input {argument}: use {readable()}")


def _matches_nothing(argument: str) -> UsageError:
    return UsageError(f"input pattern {argument} matches no input file ({readable()})")


def _glob_root(pattern: str) -> tuple[Path, list[str]]:
    """The longest leading part of a glob pattern without wildcards, and the rest."""
    parts = Path(pattern).parts
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    return (Path(*parts[:fixed]) if fixed else Path(".")), list(parts[fixed:])


def _is_dataset_metadata(path: Path) -> bool:
    return path.name in DATASET_METADATA and any(
        (path.parent / name).is_file() for name in ("state.json", "dataset_dict.json")
    )


def walk(
    root: Path, depth: int | None = None, skipped: list[tuple[str, str]] | None = None
) -> Iterator[tuple[Path, bool]]:
    """Every entry below `root` as (path, is a directory), in sorted order, `depth` levels
    deep at most. Links to directories are followed, but not into a directory that is being
    walked already above them (a loop of links), so the walk always ends. A directory below
    `root` that cannot be read is added to `skipped`, with why."""
    stack: list[tuple[Path, int, frozenset[tuple[int, int]]]] = [(root, 0, frozenset())]
    while stack:
        directory, level, above = stack.pop()
        try:
            status = directory.stat()
            if (status.st_dev, status.st_ino) in above:
                continue
            with os.scandir(directory) as scan:
                entries = sorted(scan, key=lambda e: e.name)
        except OSError as e:
            if level == 0 or skipped is None:
                raise InputError(
                    f"cannot read the input directory {directory}: {e.strerror}"
                ) from e
            skipped.append((str(directory), str(e.strerror)))
            continue
        inside = above | {(status.st_dev, status.st_ino)}
        below = []
        for entry in entries:
            is_directory = entry.is_dir()
            yield Path(entry.path), is_directory
            if is_directory and (depth is None or level + 1 < depth):
                below.append((Path(entry.path), level + 1, inside))
        stack.extend(reversed(below))


def _inputs_below(directory: Path, skipped: list[tuple[str, str]]) -> list[Path]:
    # Run directories (`_bulkembed/`) hold JSON files that are not input.
    return [
        p
        for p, is_directory in walk(directory, skipped=skipped)
        if not is_directory
        and p.is_file()
        and format_name(p, in_folder=True)
        and RUN_DIRECTORY not in p.relative_to(directory).parts
        and not _is_dataset_metadata(p)
    ]


def _matches(pattern: list[str], parts: tuple[str, ...]) -> bool:
    """Whether path segments `parts` match glob segments `pattern`, as `glob` matches them:
    `**` stands for any number of directories, and wildcards do not match names that start
    with '.' unless the pattern's segment does."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        for i in range(len(parts) + 1):
            if i and parts[i - 1].startswith("."):
                return False
            if _matches(rest, parts[i:]):
                return True
        return False
    if not parts or (parts[0].startswith(".") and not head.startswith(".")):
        return False
    return fnmatch.fnmatchcase(parts[0], head) and _matches(rest, parts[1:])


def _glob(argument: str, skipped: list[tuple[str, str]]) -> tuple[Path, list[Path]]:
    """The root of a glob pattern, and the input files it names: files that match, and
    files below directories that match (only those with a trailing `/`)."""
    root, pattern = _glob_root(argument)
    root = root.expanduser()
    if not root.is_dir():
        return root, []
    directories_only = argument.endswith(("/", os.sep))
    # `DIR/**` names DIR itself too.
    files = _inputs_below(root, skipped) if _matches(pattern, ()) else []
    depth = None if "**" in pattern else len(pattern)
    for path, is_directory in walk(root, depth, skipped):
        if not _matches(pattern, path.relative_to(root).parts):
            continue
        if is_directory:
            files.extend(_inputs_below(path, skipped))
        elif not directories_only and path.is_file() and format_name(path):
            files.append(path)
    return root, files


def _expand(argument: str, skipped: list[tuple[str, str]]) -> list[tuple[Path, Path]]:
    """(file, root) pairs for one input argument; ids are relative to the root."""
    path = Path(argument).expanduser()
    if path.is_dir():
        return [(p, path) for p in _inputs_below(path, skipped)]
    if path.is_file():
        if format_name(path) is None:
            raise _unsupported(argument)
        return [(path, path.parent)]
    if glob.has_magic(argument):
        root, files = _glob(argument, skipped)
        if not files:
            raise _matches_nothing(argument)
        return [(p, root) for p in files]
    raise UsageError(f"input not found: {argument}")


def _through_links(path: Path) -> bool:
    """Whether a path reaches its file through a link."""
    return path.absolute() != path.resolve()


def _object_input(file: ObjectPath, below: tuple[str, ...], names: set[str]) -> bool:
    """Whether an object found below a prefix (`below`: its path from there) is input, as
    `_inputs_below` decides for a local file; `names` are the objects listed with it."""
    if not format_name(file, in_folder=True) or RUN_DIRECTORY in below:
        return False
    if file.name in DATASET_METADATA and any(
        str(file.parent / name) in names for name in ("state.json", "dataset_dict.json")
    ):
        raise InputError(
            f"{file.parent} is a folder saved by datasets' save_to_disk: those are read "
            "from a local disk only; copy it there first"
        )
    return True


def _expand_object(argument: str, path: ObjectPath) -> list[tuple[ObjectPath, str, FileStatus]]:
    """(object, name for ids, status) for an input on object storage: every input object
    below a prefix, one object, or the objects a glob names, with the rules of local
    inputs."""
    parts = path.parts
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    if fixed == 0:
        raise UsageError(f"{argument}: the bucket's name cannot hold a wildcard")
    root = ObjectPath(path.scheme, "/".join(parts[:fixed]), path.options)
    pattern = list(parts[fixed:])
    listed = root.files_below()
    if not listed and not pattern:
        try:
            status = path.stat()
        except FileNotFoundError:
            if path.is_dir():  # a bucket without objects
                return []
            raise _missing(argument, path) from None
        if format_name(path) is None:
            raise _unsupported(argument)
        return [(path, path.name, status)]
    names = {str(file) for file, _ in listed}
    directories_only = argument.endswith("/")
    found = []
    for file, status in listed:
        below = file.relative_to(root).parts
        if not pattern:
            selected = _object_input(file, below, names)
        else:
            # As `_glob`: files that match, and input files below directories that match.
            selected = bool(
                not directories_only and format_name(file) and _matches(pattern, below)
            ) or any(
                _matches(pattern, below[:depth]) and _object_input(file, below[depth:], names)
                for depth in range(len(below))
            )
        if selected:
            found.append((file, "/".join(below), status))
    if pattern and not found:
        raise _missing(argument, path)
    return found


def _missing(argument: str, path: ObjectPath) -> UsageError:
    """Why an input on object storage names no file: no such bucket, or nothing there."""
    bucket = ObjectPath(path.scheme, path.bucket, path.options)
    if not bucket.exists():
        return UsageError(f"input not found: {argument} (the bucket {bucket} does not exist)")
    if glob.has_magic(path.key):
        return _matches_nothing(argument)
    return UsageError(f"input not found: {argument}")


def _refuse_output(path: AnyPath, output: AnyPath | None, argument: str) -> None:
    """An input file that is the output itself would be overwritten: refuse it."""
    if output is not None and path == output:
        raise UsageError(
            f"--output {output} is one of the inputs ({argument}): choose another --output"
        )


def _is_below(path: AnyPath, directory: AnyPath) -> bool:
    if isinstance(path, ObjectPath):
        return path.is_relative_to(directory)
    return not isinstance(directory, ObjectPath) and path.is_relative_to(directory)


def _stdin_input() -> InputFile:
    """JSON lines on stdin, copied to a temporary file that is removed when this process
    exits: the readers open an input by path, and more than once."""
    import atexit
    import shutil
    import tempfile

    with tempfile.NamedTemporaryFile(
        prefix="bulkembed-stdin-", suffix=".jsonl", delete=False
    ) as spool:
        atexit.register(os.unlink, spool.name)
        shutil.copyfileobj(sys.stdin.buffer, spool)
    path = Path(spool.name)
    return InputFile(path, STDIN, "jsonl", path.stat().st_size)


def list_inputs(
    inputs: tuple[str, ...] | list[str],
    exclude: AnyPath | None = None,
    skipped: list[tuple[str, str]] | None = None,
    options: StorageOptions | None = None,
) -> list[InputFile]:
    """Every input file once, sorted by path, then the files of `hf://` datasets in the
    order given, then stdin (`-`): the order in which units are numbered. Files below
    `exclude` (the output directory) are left out; directories that cannot be read are
    added to `skipped`. A file reached by several paths takes its name from one without
    links, if there is one.
    Inputs on object storage are reached with `options`."""
    from bulkembed.sources.hf import HF_SCHEME, dataset_files
    from bulkembed.sources.images import gather_images

    by_path: dict[AnyPath, InputFile] = {}
    # The directory each image file was found through: its image folder.
    roots: dict[str, AnyPath] = {}
    linked: set[Path] = set()
    streamed: list[InputFile] = []
    excluded = exclude.resolve() if exclude is not None else None
    for argument in inputs:
        if argument == STDIN:
            continue
        if argument.startswith(HF_SCHEME):
            streamed.extend(dataset_files(argument))
            continue
        where = location(argument, options) if is_uri(argument) else None
        if isinstance(where, ObjectPath):
            for found, name, found_status in _expand_object(argument, where):
                _refuse_output(found, excluded, argument)
                if excluded is None or not _is_below(found, excluded):
                    fmt = format_name(found) or ""
                    size, modified = found_status.st_size, found_status.st_mtime_ns
                    by_path.setdefault(found, InputFile(found, name, fmt, size, modified))
                    # Where `name` starts: the prefix, or the folder, it was found through.
                    prefix = str(found)[: len(str(found)) - len(name)].rstrip("/")
                    roots.setdefault(str(found), location(prefix, options))
            continue
        local = argument if where is None else str(where)
        for path, root in _expand(local, [] if skipped is None else skipped):
            resolved = path.resolve()
            _refuse_output(resolved, excluded, argument)
            if excluded is not None and _is_below(resolved, excluded):
                continue
            if resolved not in by_path or (resolved in linked and not _through_links(path)):
                name = os.path.relpath(path, root)
                fmt = format_name(path) or ""
                status = resolved.stat()
                by_path[resolved] = InputFile(
                    resolved, name, fmt, status.st_size, status.st_mtime_ns
                )
                roots[str(resolved)] = Path(root).resolve()
                if _through_links(path):
                    linked.add(resolved)
                else:
                    linked.discard(resolved)
    if STDIN in inputs:
        streamed.append(_stdin_input())
    if not by_path and not streamed:
        named = named_only()
        hint = f"; {named} files are read when named or matched by a glob" if named else ""
        raise UsageError(
            f"no input file ({readable(in_folders=True)}) found in {', '.join(inputs)}{hint}"
        )
    files = gather_images(sorted(by_path.values(), key=lambda s: str(s.path)), roots)
    files += streamed
    by_name: dict[str, InputFile] = {}
    for file in files:
        other = by_name.setdefault(file.name, file)
        if other is not file:
            raise InputError(
                f"{other.path} and {file.path} would give the same ids ({file.name}:N): "
                "pass their common parent directory instead, or use --id-column"
            )
    return files

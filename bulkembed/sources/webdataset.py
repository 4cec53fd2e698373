"""WebDataset shards: tar files of samples, each sample the members that share a key (the
member's path up to the first dot of its name), as img2dataset writes them: `KEY.jpg`
with an optional `KEY.txt` caption and `KEY.json` metadata.

A sample is a record: its key is its id, its image (the first member with an image
suffix) its content; `--keep-columns txt,json` passes the caption and the metadata through
as text. `records_per_unit` samples make a unit. A shard is read as a stream, from its
start, locally or on object storage; a sample without an image is quarantined, and a
shard that stops being readable sets the rest of it aside.
"""

from __future__ import annotations

import tarfile
from collections.abc import Container, Iterator
from typing import IO, ClassVar

import numpy as np
import pyarrow as pa

from bulkembed.contracts import part_name
from bulkembed.sources.base import InputFormat, ReadSettings
from bulkembed.sources.image_columns import IMAGES_PER_CHUNK, images_of
from bulkembed.sources.images import IMAGE_SUFFIXES
from bulkembed.sources.opening import READ_ERRORS
from bulkembed.sources.records import BadRecord, Chunk, InputFile
from bulkembed.storage import open_binary, stop_on_store_failure

# The members a sample's text columns come from (`--keep-columns txt,json`).
TEXT_MEMBERS = ("txt", "json")


class WebDatasetFormat(InputFormat):
    """`.tar` files of samples (`KEY.jpg`, `KEY.txt`, `KEY.json`, ...)."""

    name = "webdataset"
    suffixes: ClassVar[tuple[str, ...]] = (".tar",)
    title = "WebDataset shards"
    images = True

    def records(self, file: InputFile) -> int:
        """Samples in the shard, up to where it cannot be read."""
        count = 0
        try:
            for _ in _samples(file, keep=(), images=False):
                count += 1
        except tarfile.TarError:
            pass
        return count

    def read(
        self, index: int, file: InputFile, settings: ReadSettings, skip: Container[str]
    ) -> Iterator[Chunk]:
        per_unit = settings.records_per_unit
        source = str(file.path)
        pending = _Pending(settings)
        unit, read = 0, 0
        try:
            for number, (key, members) in enumerate(_samples(file, settings.keep_columns)):
                read = number + 1
                if number // per_unit != unit:
                    if part_name(index, unit) not in skip:
                        yield pending.chunk(index, unit, True)
                    unit, pending = number // per_unit, _Pending(settings)
                elif len(pending.ids) >= IMAGES_PER_CHUNK:
                    yield pending.chunk(index, unit, False)
                    pending = _Pending(settings)
                if part_name(index, unit) in skip:
                    continue
                pending.add(key, members, number, source)
        except (*READ_ERRORS, tarfile.TarError) as e:
            stop_on_store_failure(file.path, e)
            reason = f"unreadable after sample {read}: {e or type(e).__name__}"
            pending.bad.append(BadRecord(source, reason, row=read))
        if part_name(index, unit) not in skip:
            yield pending.chunk(index, unit, True)


class _Pending:
    """The samples of a chunk being read."""

    def __init__(self, settings: ReadSettings) -> None:
        self.settings = settings
        self.ids: list[str] = []
        self.images: list[bytes] = []
        self.positions: list[int] = []
        self.columns: dict[str, list[str | None]] = {n: [] for n in settings.column_types}
        self.bad: list[BadRecord] = []

    def add(self, key: str, members: dict[str, bytes], number: int, source: str) -> None:
        image = next((members[s] for s in members if f".{s}" in IMAGE_SUFFIXES), None)
        if image is None:
            kinds = ", ".join(sorted(members)) or "none"
            reason = f"no image in the sample (its members: {kinds})"
            self.bad.append(BadRecord(source, reason, key, row=number))
            return
        self.ids.append(key)
        self.images.append(image)
        self.positions.append(number)
        for name in self.columns:
            value = members.get(name)
            self.columns[name].append(None if value is None else value.decode("utf-8", "replace"))

    def chunk(self, index: int, unit: int, last: bool) -> Chunk:
        ids = pa.array(self.ids, pa.string()).cast(self.settings.id_type)
        images = images_of(pa.array(self.images, pa.binary()), None)
        columns = {
            name: pa.array(values, pa.string()).cast(self.settings.column_types[name])
            for name, values in self.columns.items()
        }
        chunk = Chunk(index, unit, ids, images, last, self.bad, columns=columns)
        chunk.positions = np.array(self.positions, dtype=np.int64)
        return chunk


def _samples(
    file: InputFile, keep: tuple[str, ...], images: bool = True
) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {suffix: bytes}) of each sample of a shard, in order; the bytes of members
    with an image suffix (unless `images` is false: the samples are only counted) and of
    those in `keep`, the others named with none."""
    with open_binary(file.path) as stored, tarfile.open(fileobj=stored, mode="r|*") as tar:
        key, members = None, {}
        for member in tar:
            if not member.isfile():
                continue
            folder, _, name = member.name.rpartition("/")
            stem, dot, suffix = name.partition(".")
            if not dot:
                continue
            found = f"{folder}/{stem}" if folder else stem
            if found != key and key is not None:
                yield key, members
                members = {}
            key = found
            wanted = (images and f".{suffix.lower()}" in IMAGE_SUFFIXES) or suffix in keep
            members[suffix.lower()] = _read(tar, member) if wanted else b""
        if key is not None:
            yield key, members


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    stream: IO[bytes] | None = tar.extractfile(member)
    return b"" if stream is None else stream.read()

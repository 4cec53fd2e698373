"""Folders of image files as inputs.

Image files found in an input directory (or named, or matched by a glob) are gathered, by
the directory they were found through, into one input: an image folder (`gather_images`),
whose records are its images in sorted order, `records_per_unit` of them a unit, each
named by its path relative to the folder (the id). A folder's size is its images' total,
and its modification time a digest of their names, sizes and times, so that a resume
refuses a folder whose images changed. Its images travel to the decoding processes as
paths (`image_columns.IMAGE_TYPE`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Iterator
from typing import ClassVar

import numpy as np
import pyarrow as pa

from bulkembed.contracts import part_name
from bulkembed.errors import InputError
from bulkembed.sources.base import InputFormat, ReadSettings
from bulkembed.sources.image_columns import IMAGES_PER_CHUNK, images_of
from bulkembed.sources.records import Chunk, InputFile
from bulkembed.storage import AnyPath

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".tif", ".tiff", ".bmp")


class ImageFolderFormat(InputFormat):
    """A folder of image files (`gather_images`): its images are its records."""

    name = "images"
    suffixes: ClassVar[tuple[str, ...]] = IMAGE_SUFFIXES
    title = "images"
    images = True

    def records(self, file: InputFile) -> int:
        return len(file.members)

    def read(
        self, index: int, file: InputFile, settings: ReadSettings, skip: Container[str]
    ) -> Iterator[Chunk]:
        per_unit = settings.records_per_unit
        names = file.members
        root = str(file.path).rstrip("/")
        for unit in range(max(1, -(-len(names) // per_unit))):
            if part_name(index, unit) in skip:
                continue
            end = min(len(names), (unit + 1) * per_unit)
            start = unit * per_unit
            while True:
                stop = min(end, start + IMAGES_PER_CHUNK)
                ids = pa.array(names[start:stop], pa.string())
                paths = pa.array([f"{root}/{n}" for n in names[start:stop]], pa.string())
                chunk = Chunk(index, unit, ids, images_of(None, paths), stop >= end)
                chunk.positions = np.arange(start, stop, dtype=np.int64)
                yield chunk
                start = stop
                if start >= end:
                    break


def gather_images(files: list[InputFile], roots: dict[str, AnyPath]) -> list[InputFile]:
    """`files` with their image files (`ImageFolderFormat`) gathered into one image folder
    per directory they were found through (`roots`: each image's, by its path), in its
    place."""
    folders: dict[AnyPath, list[InputFile]] = {}
    others: list[InputFile] = []
    for file in files:
        if file.format == ImageFolderFormat.name and not file.members:
            folders.setdefault(roots[str(file.path)], []).append(file)
        else:
            others.append(file)
    named: dict[str, AnyPath] = {}
    for root, images in folders.items():
        for image in images:
            other = named.setdefault(image.name, root)
            if other != root:
                raise InputError(
                    f"{other}/{image.name} and {root}/{image.name} would have the same id "
                    f"({image.name}): pass their common parent directory instead"
                )
        listing = hashlib.blake2b(digest_size=8)
        for image in images:
            listing.update(f"{image.name}\0{image.size}\0{image.modified}\n".encode())
        others.append(
            InputFile(
                root,
                root.name or str(root),
                ImageFolderFormat.name,
                sum(image.size for image in images),
                int.from_bytes(listing.digest(), "big") >> 1,
                tuple(image.name for image in images),
            )
        )
    return sorted(others, key=lambda f: str(f.path))

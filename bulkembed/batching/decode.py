"""Decode images: what an image worker process does to a chunk of a run, and what the
in-process encoder does to the images it is given (`image_chunks`).

A worker reads each image's bytes (held in the record, or at a path), hashes them, and
decodes, resizes and crops them (`ImageProcessing`). The contents of an image chunk are an
Arrow struct array of `bytes` (binary) and `path` (string: a local path or an
object-storage URI): the bytes where a record holds them, else the file at the path
(`sources.image_columns.IMAGE_TYPE`). An image that cannot be read or decoded is no
error: its reason goes back with the chunk and the record is quarantined.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from bulkembed.batching.tokenize import KnownTexts, Prepared, TokenizedChunk
from bulkembed.config import DEFAULT_MAX_IMAGE_PIXELS
from bulkembed.errors import BulkembedError, InputError
from bulkembed.models.image_processing import BadImage, ImageProcessing
from bulkembed.sources import Chunk
from bulkembed.sources.image_columns import IMAGES_PER_CHUNK
from bulkembed.storage import StorageOptions, location

if TYPE_CHECKING:
    from bulkembed.sources import IdKey


@dataclass(frozen=True, slots=True)
class ImageSettings:
    """What an image worker needs: the model's preprocessing, the largest image it decodes
    (pixels), and how to reach images on object storage."""

    processing: ImageProcessing
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    storage: StorageOptions | None = None
    # What its worker processes are called in errors.
    stage = "image decoder"

    def preparer(self, previous: KnownTexts | None, id_key: IdKey | None) -> ImagePreparer:
        """What a worker process runs on each chunk (`bulkembed.batching.tokenize.Preparer`)."""
        return ImagePreparer(self, previous, id_key)


class ImagePreparer:
    """Decodes a chunk's images. With `previous` (a previous output's lookup), images it
    holds unchanged (same id, same bytes) are not decoded: they are carried over."""

    def __init__(
        self, settings: ImageSettings, previous: KnownTexts | None, id_key: IdKey | None
    ) -> None:
        self.settings = settings
        self.previous = previous
        self.id_key = id_key

    def timed(self, inputs_of_chunk: tuple[pa.Array, pa.Array, np.ndarray]) -> Prepared:
        """For a chunk's images and ids: their pixels, lengths (the tokens an image is to
        the model; 0 for one not decoded), the seconds decoding took, the hashes of the
        images' bytes and of the ids, and why an image could not be read."""
        contents, ids, _ = inputs_of_chunk
        assert self.id_key is not None, "a run's decoder hashes ids with the run's key"
        count = len(contents)
        reasons: dict[int, str] = {}
        data: list[bytes | None] = []
        started = time.perf_counter()
        for index, value in enumerate(contents.to_pylist()):
            try:
                data.append(self._bytes(value))
            except BadImage as e:
                reasons[index] = str(e)
                data.append(None)
        digests = np.array(
            [b"" if d is None else hashlib.blake2b(d, digest_size=16).digest() for d in data],
            dtype="S16",
        )
        keys = self.id_key.hashes(ids)
        skipped = None if self.previous is None else self.previous.counted(keys, digests)
        processing = self.settings.processing
        lengths = np.zeros(count, np.int32)
        images = []
        for index, raw in enumerate(data):
            if raw is None or (skipped is not None and skipped[index]):
                continue
            try:
                images.append(processing.pixels(raw, self.settings.max_pixels))
            except BadImage as e:
                reasons[index] = str(e)
                continue
            lengths[index] = processing.tokens
        height, width = processing.shape
        pixels = np.stack(images) if images else np.empty((0, height, width, 3), np.uint8)
        seconds = time.perf_counter() - started
        return Prepared(
            np.zeros(int(lengths.sum()), np.int32),
            lengths,
            np.zeros(count, bool),
            seconds,
            digests,
            keys,
            skipped,
            np.zeros(count, np.int8),
            pixels,
            reasons or None,
        )

    def _bytes(self, value: dict[str, object] | None) -> bytes:
        """An image's bytes: those the record holds, else the file's at its path."""
        if value is None or (value.get("bytes") is None and value.get("path") is None):
            raise BadImage("image is null")
        held = value.get("bytes")
        if isinstance(held, bytes):
            return held
        path = str(value["path"])
        try:
            return location(path, self.settings.storage).read_bytes()
        except FileNotFoundError:
            raise BadImage(f"no image at {path}") from None
        except (OSError, ValueError, BulkembedError) as e:
            # A path that names no file a store holds (`location` refuses it), or a read
            # that fails: the record's, not the run's.
            raise BadImage(f"cannot read the image at {path}: {e}") from None


def image_list(images: Any) -> list[Any]:
    """One image (a path, bytes or a PIL image) or a sequence of them, as a list."""
    if isinstance(images, (str, bytes, os.PathLike)) or hasattr(images, "getbands"):
        return [images]
    return list(images)


def image_chunks(
    images: Sequence[Any], processing: ImageProcessing, max_pixels: int
) -> Iterator[TokenizedChunk]:
    """`images` decoded (`ImageProcessing.pixels`; a PIL image taken as it is), in chunks
    of `IMAGES_PER_CHUNK`, as one unit. An image that cannot be is an `InputError` that
    says which and why."""
    for start in range(0, len(images), IMAGES_PER_CHUNK):
        end = min(start + IMAGES_PER_CHUNK, len(images))
        started = time.perf_counter()
        pixels = np.stack(
            [_pixels(images[i], i, processing, max_pixels) for i in range(start, end)]
        )
        positions = np.arange(start, end, dtype=np.int64)
        chunk = Chunk(0, 0, pa.array(positions), pa.array([], pa.string()), end == len(images))
        chunk.positions = positions
        lengths = np.full(end - start, processing.tokens, np.int32)
        yield TokenizedChunk(
            chunk,
            np.zeros(int(lengths.sum()), np.int32),
            lengths,
            np.zeros(end - start, bool),
            time.perf_counter() - started,
            pixels=pixels,
        )


def _pixels(image: Any, index: int, processing: ImageProcessing, max_pixels: int) -> np.ndarray:
    try:
        if hasattr(image, "getbands"):
            return processing.prepared(image)
        if isinstance(image, bytes):
            return processing.pixels(image, max_pixels)
        if isinstance(image, (str, os.PathLike)):
            try:
                data = Path(image).read_bytes()
            except OSError as e:
                raise BadImage(f"cannot read {image}: {e.strerror or e}") from None
            return processing.pixels(data, max_pixels)
    except BadImage as e:
        raise InputError(f"image {index}: {e}") from None
    raise InputError(
        f"image {index} is a {type(image).__name__}: give a path, bytes or a PIL image"
    )

"""Hugging Face datasets as input: `hf://NAME[/CONFIG][:SPLIT]`, streamed through `datasets`.

NAME is a hub id (`org/name`) or a local folder of data files; a third path part is the
configuration (`hf://org/name/config`); SPLIT defaults to `train`. A dataset is streamed in
its own files (one per data file); each becomes one input file of the run, cut into units
of a fixed number of records like JSON lines. A resumed run streams each file again and
skips the records of its done units.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bulkembed.errors import InputError, UsageError
from bulkembed.sources.base import ReadSettings, RecordFormat
from bulkembed.sources.columns import TYPE_SAMPLE_LINES
from bulkembed.sources.records import Chunk, InputFile
from bulkembed.storage import SCHEMES

HF_SCHEME = "hf://"
DEFAULT_SPLIT = "train"


@dataclass(frozen=True, slots=True)
class DatasetName:
    """A parsed `hf://` input."""

    name: str
    config: str | None
    split: str

    @property
    def label(self) -> str:
        config = f"/{self.config}" if self.config else ""
        return f"{HF_SCHEME}{self.name}{config}:{self.split}"


def parse_dataset_name(argument: str) -> DatasetName:
    """`hf://NAME[/CONFIG][:SPLIT]`; a local folder is taken whole as NAME."""
    rest = argument.removeprefix(HF_SCHEME)
    if rest.partition("://")[0] in SCHEMES:
        raise UsageError(
            f"{argument}: hf:// datasets are read from the Hugging Face Hub or a local folder "
            "only, not from object storage"
        )
    location, _, split = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not location:
        raise UsageError(f"{argument}: write hf://NAME, hf://NAME/CONFIG or hf://NAME:SPLIT")
    if Path(location).expanduser().is_dir():
        return DatasetName(str(Path(location).expanduser()), None, split or DEFAULT_SPLIT)
    parts = location.split("/")
    name, config = "/".join(parts[:2]), "/".join(parts[2:]) or None
    return DatasetName(name, config, split or DEFAULT_SPLIT)


@functools.lru_cache(maxsize=16)
def _stream(dataset: DatasetName) -> Any:
    import datasets

    try:
        stream = datasets.load_dataset(
            dataset.name, dataset.config, split=dataset.split, streaming=True
        )
        # Images (the `Image` feature) come as their bytes and path, not decoded here.
        return stream.decode(False)
    except Exception as e:  # datasets raises many kinds: missing, offline, bad split
        raise InputError(f"cannot open {dataset.label}: {e}") from e


def dataset_files(argument: str) -> list[InputFile]:
    """One file per data file of the dataset, in the dataset's order."""
    dataset = parse_dataset_name(argument)
    stream = _stream(dataset)
    return [
        InputFile(Path(dataset.name), f"{dataset.label}#{i:05d}", "hf", 0)
        for i in range(stream.n_shards)
    ]


def _owner(file: InputFile) -> tuple[DatasetName, int]:
    label, _, number = file.name.rpartition("#")
    return parse_dataset_name(label), int(number)


def dataset_records(file: InputFile) -> Iterator[dict[str, Any]]:
    """The records of one dataset file, as dicts, in order."""
    dataset, number = _owner(file)
    stream = _stream(dataset)
    yield from stream.shard(num_shards=stream.n_shards, index=number)


def dataset_size(file: InputFile) -> int:
    """Records in a dataset file if the dataset says (its split size when it has one
    file), else 0: unknown."""
    dataset, _ = _owner(file)
    stream = _stream(dataset)
    splits = getattr(stream.info, "splits", None) or {}
    split = splits.get(dataset.split)
    if split is None or stream.n_shards != 1:
        return 0
    return int(split.num_examples or 0)


def _as_record(item: Any) -> tuple[dict[str, Any] | None, str | None]:
    """A dataset record is a dict already."""
    return item, None


class DatasetFormat(RecordFormat):
    """`hf://` datasets, one input file per data file of the dataset, streamed: their units
    cannot be counted before they are read."""

    name = "hf"

    streamed = True

    def source(self, file: InputFile) -> str:
        return file.name

    def records(self, file: InputFile) -> int:
        return dataset_size(file)

    def sample(self, file: InputFile) -> tuple[list[dict[str, Any]], int]:
        return list(itertools.islice(dataset_records(file), TYPE_SAMPLE_LINES)), 1

    def read(
        self, index: int, file: InputFile, settings: ReadSettings, skip: Container[str]
    ) -> Iterator[Chunk]:
        try:
            yield from self.units_of(
                index, file, settings, skip, dataset_records(file), _as_record, ()
            )
        except InputError:
            raise
        except Exception as e:  # a stream fails in many ways (network, server, decoding)
            raise InputError(
                f"reading {file.name} failed: {e}; run the same command again to resume"
            ) from e

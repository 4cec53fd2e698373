"""Which units of work a run takes: those not done yet, and with `--shard I/N` every Nth."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from bulkembed.config import ShardSpec
from bulkembed.errors import InputError
from bulkembed.sources import InputFile, format_of, unit_names


@dataclass(frozen=True, slots=True)
class SkippedUnits:
    """The units the reader passes over: those done, and with `--shard` other shards'."""

    done: Container[str]
    mine: Container[str] | None

    def __contains__(self, part: object) -> bool:
        return part in self.done or (self.mine is not None and part not in self.mine)


@dataclass(frozen=True, slots=True)
class PendingUnits:
    """The units a run still embeds: those not done, and with `--shard` only its own."""

    done: Container[str]
    mine: Container[str] | None

    def __contains__(self, part: object) -> bool:
        return part not in self.done and (self.mine is None or part in self.mine)

    @property
    def skipped(self) -> SkippedUnits:
        """The units the reader passes over."""
        return SkippedUnits(self.done, self.mine)


def counted_units(files: list[InputFile], records_per_unit: int) -> list[str]:
    """Every unit of the inputs, in order, for runs that share them out up front."""
    if any(format_of(s).streamed for s in files):
        raise InputError(
            "--shard and --engine ray need inputs whose units can be counted up front: "
            "files, not hf:// datasets (save the dataset to Parquet first)"
        )
    return unit_names(files, records_per_unit)


def shard_parts(units: list[str], shard: ShardSpec) -> frozenset[str]:
    """The units of `--shard I/N`: every Nth of `units` (in input order), from the Ith."""
    return frozenset(units[shard.index :: shard.count])

"""What a run does besides embedding its pending units: its mode.

A plain run (fresh, or resuming its own output) writes the pending units and nothing else.
An incremental run (`--since`, into a new Parquet output with a change set or a LanceDB
table synced in place: `bulkembed.engine.since.Incremental`) also carries unchanged rows
over from the previous output, writes each unit's new and changed rows a second time (the
upserts), and, once every unit is done, decides the deletes. `embed_corpus` and every
dispatcher ask the mode these questions and never which mode it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from bulkembed.carry import CarryOver

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord
    from bulkembed.encoders.base import VectorSizes
    from bulkembed.sinks import Sink
    from bulkembed.summary import PreviousCounts

# What makes a writing process's sink of upserts (None: the mode writes none). It is
# pickled into device processes and Ray actors, so a module-level function or a sink's.
UpsertSinks = Callable[[], "Sink | None"]


def no_upserts() -> Sink | None:
    """The sink of upserts of a mode that writes none."""
    return None


class RunMode(Protocol):
    """The questions `embed_corpus` and the dispatchers ask of a run's mode."""

    def start(self, done: dict[str, UnitRecord], complete: bool) -> bool:
        """Read what the mode needs before units run, given the done units and whether the
        output is complete; whether it is complete now (a mode may take up a finished one
        again)."""
        ...

    def state(self) -> dict[str, Any]:
        """What the run's configuration keeps of the mode across restarts."""
        ...

    def describe(self) -> str:
        """The start-up line's words on the mode ("" for none)."""
        ...

    def carrier(self) -> CarryOver:
        """What carries unchanged records over from a previous output (`bulkembed.carry`),
        wherever chunks are tokenized; its lookup, for tokenizers to leave unchanged texts
        untokenized."""
        ...

    def sizes(self) -> VectorSizes | None:
        """The sizes of the vectors the run writes, where they are known without the model
        (a previous output made with the same settings has them); None otherwise."""
        ...

    def upserts(self) -> UpsertSinks:
        """What makes each writing process's sink of upserts."""
        ...

    def end(self, phase: Callable[[str], None]) -> Callable[[], None] | None:
        """What runs once every unit is done, before the output is marked complete."""
        ...

    def changes(self) -> PreviousCounts | None:
        """What the summary counts against a previous output."""
        ...

    def close(self) -> None:
        """Let go of what `start` read."""
        ...


class PlainRun:
    """A run that writes its pending units and nothing else: fresh, or resumed."""

    def start(self, done: dict[str, UnitRecord], complete: bool) -> bool:
        return complete

    def state(self) -> dict[str, Any]:
        return {"previous_rows": None}

    def describe(self) -> str:
        return ""

    def carrier(self) -> CarryOver:
        return CarryOver(None, [])

    def sizes(self) -> VectorSizes | None:
        return None

    def upserts(self) -> UpsertSinks:
        return no_upserts

    def end(self, phase: Callable[[str], None]) -> Callable[[], None] | None:
        return None

    def changes(self) -> PreviousCounts | None:
        return None

    def close(self) -> None:
        return None

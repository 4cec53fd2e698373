"""Kinds of output, by registry: what `--output` names, and what each kind can do.

A kind of output (`SinkKind`) parses the `--output` values that are its own into an
`OutputTarget`, opens the sink that writes there, and declares its `Capabilities` (those
that come with something to give, a change set or an in-place sync, follow from giving it). The
engines, the CLI and the API ask the registry and the capabilities, never a sink's class:
a new kind of output is one module that declares its kind and calls `register_sink`.
The built-in kinds (Parquet parts, LanceDB tables, stdout) are in `bulkembed.sinks.builtin`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from bulkembed.config import RunConfig, StreamFormat
from bulkembed.errors import UsageError

if TYPE_CHECKING:
    from bulkembed.sinks.base import ChangeSet, InPlaceSync, IntentLog, Sink
    from bulkembed.storage import AnyPath, StorageOptions


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a kind of output can do.

    - `resumable`: committed parts outlive the run, and a ledger in a run directory says
      which; a rerun resumes. Without it (a stream) the run keeps its bookkeeping in a
      temporary directory, and removes it at the end.
    - `many_writers`: processes beside the run's (device processes, `--shard` runs, Ray
      actors) may commit parts into the output at the same time, each through its own sink
      (`Sink.process_copies`). Without it every row is written by the run's own process.
    - `change_set`: a `--since` run into it writes the change set beside the output (the
      kind's `change_set` makes it), and ends by writing the previous rows it keeps as
      parts: its sink lists committed ids (`committed_ids`), gives a part's schema
      (`part_schema`) and discards parts (`discard`).
    - `indexes`: it builds vector and full-text indexes (`--index`, `--fts`).
    - `in_place`: a `--since` naming the output itself updates it in place (the kind's
      `in_place` gives the `InPlaceSync`).
    - `streamed`: a reader takes the rows as they are written (stdout): windows end at
      every unit's end, so that each unit's rows go out as soon as they are embedded.

    `change_set` and `in_place` follow from the kind giving what they need; they are not
    declared.
    """

    resumable: bool = True
    many_writers: bool = False
    change_set: bool = False
    indexes: bool = False
    in_place: bool = False
    streamed: bool = False


@dataclass(frozen=True, slots=True)
class OutputTarget:
    """A parsed `--output`: its kind's name; `path`, where it is (None for a stream);
    `name`, a table or collection in `path` where the kind has them; `label`, how messages
    name it (a string that parses back to it); `run_directory`, where its ledger lives
    (None: a temporary one, for a kind that is not resumable)."""

    kind: str
    label: str
    path: AnyPath | None = None
    name: str | None = None
    run_directory: AnyPath | None = None

    @property
    def capabilities(self) -> Capabilities:
        return sink_kind(self.kind).capabilities


@dataclass(frozen=True, slots=True)
class SinkSettings:
    """The run's settings that shape its sink: the vector metric (`cosine` for normalized
    vectors, else `dot`), `--stream-format`, `--index` (a kind, or None), its partitions,
    the column `--fts` indexes (None: no full-text index), where writers keep their
    intents (the run directory's, for kinds that commit in two steps), and the inputs' text
    column (what a store's embedding function reads)."""

    metric: str = "cosine"
    stream_format: StreamFormat = StreamFormat.JSONL
    index: str | None = None
    index_partitions: int | None = None
    fts_column: str | None = None
    intents: IntentLog | None = None
    text_column: str = "text"

    @classmethod
    def of(cls, config: RunConfig, normalize: bool, intents: IntentLog | None) -> SinkSettings:
        return cls(
            metric="cosine" if normalize else "dot",
            stream_format=config.output.stream_format or StreamFormat.JSONL,
            index=config.output.index_type.value if config.output.index else None,
            index_partitions=config.output.index_partitions,
            fts_column=config.inputs.text_column if config.output.fts else None,
            intents=intents,
            text_column=config.inputs.text_column,
        )


@dataclass(frozen=True, slots=True)
class SinkKind:
    """A kind of output: `parse` takes an `--output` value and returns its target, or None
    when the value is not of this kind (`options` reach object storage); `open` makes the
    sink that writes a target. `in_place`, for a kind that can be synced in place, gives
    what the sync needs of an opened sink; `change_set`, for a kind that keeps a change set
    beside it, makes one in a run directory. A kind's settings of its own ride on its
    target: `parse` returns a frozen subclass of `OutputTarget` with fields of its own,
    read from the `--output` value's query (`kind://NAME?setting=...`) or from
    `BULKEMBED_<KIND>_<SETTING>`, and refuses a wrong one with a `UsageError`."""

    name: str
    parse: Callable[[str, StorageOptions | None], OutputTarget | None]
    open: Callable[[OutputTarget, SinkSettings], Sink]
    capabilities: Capabilities = Capabilities()
    in_place: Callable[[Sink], InPlaceSync] | None = None
    change_set: Callable[[AnyPath], ChangeSet] | None = None

    def __post_init__(self) -> None:
        declared = self.capabilities
        if declared.in_place or declared.change_set:
            raise ValueError(
                f"sink kind {self.name}: in_place and change_set are not declared: give the "
                "kind's in_place or change_set, and the capability follows"
            )
        given = replace(
            declared, in_place=self.in_place is not None, change_set=self.change_set is not None
        )
        object.__setattr__(self, "capabilities", given)


# Kinds by name, in the order they were registered; the latest is asked first.
_KINDS: dict[str, SinkKind] = {}


def register_sink(kind: SinkKind) -> None:
    """Add a kind of output, or replace the one of the same name where it stands. Kinds
    added later are asked first, so that a kind with a scheme of its own comes before a
    plain directory."""
    _KINDS[kind.name] = kind


def unregister_sink(name: str) -> None:
    """Remove a kind of output added by `register_sink`."""
    _KINDS.pop(name, None)


def sink_kind(name: str) -> SinkKind:
    """The registered kind of this name."""
    try:
        return _KINDS[name]
    except KeyError:
        raise UsageError(f"no kind of output is registered as {name!r}") from None


def parse_output(output: str, options: StorageOptions | None = None) -> OutputTarget:
    """The target `--output` names, as the latest kind that takes it parses it."""
    if not output.strip():
        raise UsageError(
            "--output is empty: name a directory, lancedb://PATH?table=NAME, or - for stdout"
        )
    for kind in reversed(_KINDS.values()):
        target = kind.parse(output, options)
        if target is None:
            continue
        if kind.capabilities.resumable != (target.run_directory is not None):
            raise ValueError(
                f"sink kind {kind.name}: a resumable kind names its target's run directory, "
                "and only such a kind does"
            )
        return target
    raise UsageError(f"--output {output}: no kind of output takes it")


def make_sink(target: OutputTarget, settings: SinkSettings) -> Sink:
    """The sink that writes `target`."""
    return sink_kind(target.kind).open(target, settings)


def sink_of(target: OutputTarget) -> Sink:
    """The sink of an existing output, to read what it holds (`bulkembed status`)."""
    if not target.capabilities.resumable:
        raise UsageError(f"{target.label} keeps no run directory to report on")
    return make_sink(target, SinkSettings())


def change_set_of(target: OutputTarget, meta: AnyPath) -> ChangeSet | None:
    """The change set a `--since` run into `target` keeps in its run directory `meta`; None
    for a kind that keeps none."""
    make = sink_kind(target.kind).change_set
    return None if make is None else make(meta)


def in_place(target: OutputTarget, sink: Sink) -> InPlaceSync:
    """What an in-place sync of `target` needs of its opened `sink`."""
    given = sink_kind(target.kind).in_place
    if given is None:
        raise UsageError(f"{target.label} cannot be synced in place")
    return given(sink)

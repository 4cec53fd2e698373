"""Where embeddings go: Parquet parts, a LanceDB table, stdout, or a kind of output
registered by `register_sink` (`bulkembed.sinks.registry`).

`--output` names the target: a directory, `lancedb://PATH[?table=NAME]`, or `-`.
"""

from bulkembed.sinks.base import ChangeSet, InPlaceSync, IntentLog, OutputRows, Recovered, Sink
from bulkembed.sinks.builtin import register_builtin_sinks
from bulkembed.sinks.part_files import part_label, part_path
from bulkembed.sinks.previous_parts import PreviousParts
from bulkembed.sinks.registry import (
    Capabilities,
    OutputTarget,
    SinkKind,
    SinkSettings,
    change_set_of,
    in_place,
    make_sink,
    parse_output,
    register_sink,
    sink_kind,
    sink_of,
    unregister_sink,
)

register_builtin_sinks()

__all__ = [
    "Capabilities",
    "ChangeSet",
    "InPlaceSync",
    "OutputRows",
    "IntentLog",
    "OutputTarget",
    "PreviousParts",
    "Recovered",
    "Sink",
    "SinkKind",
    "SinkSettings",
    "change_set_of",
    "in_place",
    "make_sink",
    "parse_output",
    "part_label",
    "part_path",
    "register_sink",
    "sink_kind",
    "sink_of",
    "unregister_sink",
]

"""Run modes: what a run does besides embedding its pending units (`base.RunMode`).

A plain run (`plain`) writes the pending units and nothing else. A `--since` run also
carries unchanged rows over from the previous output, writes each unit's new and changed
rows a second time (the upserts) and, once every unit is done, decides the deletes: into a
new output with a change set (`change_set`), or syncing a LanceDB table in place
(`in_place`). `plan_run` picks the mode once (`choose_mode`); `embed_corpus` and the engines
ask it questions and never which mode it is. A mode of one's own (a run that only lists
what is pending, say) derives from `base.Mode` and is set on the plan.
"""

from __future__ import annotations

from bulkembed.config import RunConfig
from bulkembed.engine.modes.base import Mode, OpenedRun, RunMode
from bulkembed.engine.modes.change_set import ChangeSetRun
from bulkembed.engine.modes.in_place import InPlaceSync
from bulkembed.engine.modes.plain import PlainRun
from bulkembed.engine.modes.upserts import UpsertSinks, no_upserts, part_writer
from bulkembed.engine.sync import syncs_in_place
from bulkembed.sinks import OutputTarget
from bulkembed.storage import StorageOptions

__all__ = [
    "ChangeSetRun",
    "InPlaceSync",
    "Mode",
    "OpenedRun",
    "PlainRun",
    "RunMode",
    "UpsertSinks",
    "choose_mode",
    "no_upserts",
    "part_writer",
]


def choose_mode(config: RunConfig, target: OutputTarget, options: StorageOptions) -> RunMode:
    """The mode of a run of `config` writing `target`."""
    if config.run.since is None:
        return PlainRun()
    if syncs_in_place(config, target, options):
        return InPlaceSync()
    return ChangeSetRun()

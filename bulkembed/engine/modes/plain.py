"""A plain run: fresh, or resuming its own output; it writes the pending units and nothing
else."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from bulkembed.engine.modes.base import Mode, OpenedRun, opened_directory, own_output
from bulkembed.engine.sync import refuse_synced

if TYPE_CHECKING:
    from bulkembed.contracts import UnitRecord
    from bulkembed.engine.plan import RunPlan
    from bulkembed.reporting.progress import Reporter


class PlainRun(Mode):
    """A run without `--since`."""

    @contextlib.contextmanager
    def open(self, plan: RunPlan, reporter: Reporter) -> Iterator[OpenedRun]:
        refuse_synced(plan)
        self.mine = plan.my_units
        with (
            own_output(plan) as (run, sink),
            opened_directory(plan, run, sink, reporter, _as_it_is) as opened,
        ):
            yield opened


def _as_it_is(settings: dict[str, Any], done: dict[str, UnitRecord], complete: bool) -> bool:
    """A plain run is complete when its output is."""
    return complete

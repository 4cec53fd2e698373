"""Importing OpenVINO without its usage telemetry.

`import openvino` starts OpenVINO's telemetry: it writes a client id to
`~/intel/openvino_ga_cid` and sends a `general_import` event (and one per model
conversion) to Google Analytics, unless `CI=true` or a consent file written by its
`opt_in_out` script says no. A tool that embeds a corpus should not report home through a
dependency, so bulkembed declines for the processes where it is the first to import
OpenVINO: the telemetry package is hidden from OpenVINO, which falls back to its own stub
that writes and sends nothing. Nothing is written to the home directory to decline.

`BULKEMBED_OPENVINO_TELEMETRY=1` leaves the choice to OpenVINO (its consent file). A process
that imported OpenVINO before bulkembed did keeps what OpenVINO decided then.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

OPT_IN = "BULKEMBED_OPENVINO_TELEMETRY"


def decline_telemetry() -> None:
    """Hide OpenVINO's telemetry package from OpenVINO, unless `OPT_IN` says to keep it or
    it is imported already."""
    if os.environ.get(OPT_IN) == "1" or "openvino_telemetry" in sys.modules:
        return
    # A None entry makes `import openvino_telemetry` raise ImportError: OpenVINO's
    # conversion tools then use their telemetry stub.
    sys.modules["openvino_telemetry"] = None  # type: ignore[assignment]


def import_openvino() -> ModuleType:
    """`openvino`, imported with its telemetry declined (`decline_telemetry`)."""
    decline_telemetry()
    import openvino

    return openvino

"""int8/uint8 ranges for device processes that embed and commit whole units (`UnitPool`):
calibrated here, before they start, as a one-process run calibrates them on its first window
(`CalibratingFormat`), so that every device process quantizes with the same ranges and a
run on several devices writes the vectors of a run on one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from bulkembed.engine.session import DeviceSession, start_session
from bulkembed.engine.stream import CalibratingFormat, embed_windows, gather_windows
from bulkembed.reporting.progress import QuietReporter, RunStats

if TYPE_CHECKING:
    from bulkembed.batching.tokenize import TokenizedChunk
    from bulkembed.config import DType
    from bulkembed.models.model_spec import ModelSpec
    from bulkembed.output.format import OutputFormat
    from bulkembed.reporting.progress import Reporter
    from bulkembed.run_dir import RunDirectory


def calibrate_ahead(
    spec: ModelSpec,
    device: str,
    dtype: DType,
    threads: int,
    tokenized: Iterator[TokenizedChunk],
    output_format: OutputFormat,
    run: RunDirectory,
    reporter: Reporter,
) -> tuple[OutputFormat, list[TokenizedChunk]]:
    """`output_format` with the int8/uint8 ranges of the first window of `tokenized` that
    holds a document, embedded here on `device` in `dtype` with `threads` (as each device
    process embeds) and stored in `run`; the model is let go again. Returns the format
    (still uncalibrated where no document came: then nothing is quantized) and the chunks
    read, still to embed: the device processes embed and commit every unit, those of the
    first window included."""
    read: list[TokenizedChunk] = []

    def reading() -> Iterator[TokenizedChunk]:
        for chunk in tokenized:
            read.append(chunk)
            yield chunk

    calibrating = CalibratingFormat(output_format, run)
    sessions = [start_session(spec, [device], dtype, threads, reporter)]
    try:
        session = sessions[0]
        assert isinstance(session, DeviceSession), "the dtype is settled before"
        scratch = RunStats()
        gathered = gather_windows(reading(), session.embedder, session.budget, scratch)

        def until_calibrated() -> Iterator[list[TokenizedChunk]]:
            for window in gathered:
                yield window
                if not calibrating.output_format.needs_ranges:
                    return

        reporter.phase(f"calibrating --quantize on {device}")
        # The vectors are not written, nor counted: the device processes embed them again.
        embed_windows(
            until_calibrated(),
            session,
            calibrating,
            lambda window: None,
            scratch,
            QuietReporter(),
            sessions.append,
        )
    finally:
        for started in sessions:
            started.close()
    return calibrating.output_format, read

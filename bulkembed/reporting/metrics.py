"""Prometheus metrics of a run, while it runs: served on `--metrics-port`, or written to
`--metrics-file` for node_exporter's textfile collector (every `FILE_INTERVAL_SECONDS`, and
at the end). Needs `prometheus-client` (`pip install 'bulkembed[metrics]'`).

`MetricsReporter` stands in front of the run's reporter: each update it passes on is also
what the next scrape reads. The metrics, all named `bulkembed_...` and labelled with the
run's `output`:

- counters: `documents_embedded_total` (by the model), `documents_carried_total` (from a
  `--since` output), `documents_saved_total` (from an interrupted run), `documents_read_total`,
  `tokens_embedded_total`, `padded_tokens_total`, `batches_total`, `stage_seconds_total`
  (by `stage`: read, tokenize, pack, model, post-process, write);
- gauges: `documents` (to do, once counted), `embedding_seconds`, `documents_per_second`
  and `tokens_per_second` (the run's rates, as its summary gives them),
  `device_idle_ratio`, `up` (1 while the run embeds, 0 once it ended);
- `run_info` (labels `model`, `dtype`, `device` once known).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bulkembed.errors import UsageError
from bulkembed.reporting.progress import Reporter, RunStats

FILE_INTERVAL_SECONDS = 10.0
# How a metrics file bulkembed wrote begins (the first metric's help line).
_FIRST_LINE = b"# HELP bulkembed_"


def _written_here(path: Path) -> bool:
    """Whether `path` is a metrics file of an earlier run, which may be written over."""
    try:
        with open(path, "rb") as f:
            return f.read(len(_FIRST_LINE)) == _FIRST_LINE
    except OSError:
        return False


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise UsageError(
            "--metrics-port and --metrics-file need prometheus-client: "
            "pip install 'bulkembed[metrics]'"
        ) from None
    return prometheus_client


class _Collector:
    """The metrics of the latest update, read at each scrape."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.stats: RunStats | None = None
        self.total: int | None = None
        self.info: dict[str, str] = {}
        self.running = True

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            InfoMetricFamily,
        )

        labels = ["output"]
        stats = self.stats or RunStats()
        counters = {
            "documents_embedded": (stats.docs, "Documents the model embedded."),
            "documents_carried": (stats.carried, "Documents carried over from --since."),
            "documents_saved": (stats.saved, "Documents an interrupted run saved, taken."),
            "documents_read": (stats.read, "Documents read (tokenized or carried over)."),
            "tokens_embedded": (stats.tokens, "Tokens the model embedded."),
            "padded_tokens": (stats.padded_tokens, "Tokens computed, padding included."),
            "batches": (stats.batches, "Batches embedded."),
        }
        for name, (value, text) in counters.items():
            counter = CounterMetricFamily(f"bulkembed_{name}", text, labels=labels)
            counter.add_metric([self.output], value)
            yield counter
        stages = CounterMetricFamily(
            "bulkembed_stage_seconds", "Busy seconds of each stage.", labels=[*labels, "stage"]
        )
        for stage, seconds in stats.stages.items():
            stages.add_metric([self.output, stage], seconds)
        yield stages
        gauges: dict[str, tuple[float, str]] = {
            "embedding_seconds": (stats.embedding_seconds, "Seconds since the first batch."),
            "documents_per_second": (stats.docs_per_s, "Documents embedded per second."),
            "tokens_per_second": (stats.tokens_per_s, "Tokens embedded per second."),
            "device_idle_ratio": (stats.device_idle_fraction, "Share of time the model waited."),
            "up": (1.0 if self.running else 0.0, "1 while the run embeds."),
        }
        if self.total is not None:
            gauges["documents"] = (float(self.total), "Documents of the run, once counted.")
        for name, (level, text) in gauges.items():
            gauge = GaugeMetricFamily(f"bulkembed_{name}", text, labels=labels)
            gauge.add_metric([self.output], level)
            yield gauge
        info = InfoMetricFamily("bulkembed_run", "The run's model and devices.", labels=labels)
        info.add_metric([self.output], {k: str(v) for k, v in self.info.items()})
        yield info


class MetricsReporter:
    """`reporter`, with the run's metrics served on `port` and/or written to `path`."""

    def __init__(self, reporter: Reporter, output: str, port: int | None, path: str | None) -> None:
        prometheus = _prometheus()
        self.reporter = reporter
        self.collector = _Collector(output)
        self.registry = prometheus.CollectorRegistry()
        self.registry.register(self.collector)
        self.path = None if path is None else Path(path)
        if self.path is not None and self.path.exists() and not _written_here(self.path):
            raise UsageError(
                f"--metrics-file {self.path} exists and is not bulkembed's metrics: choose "
                "another file"
            )
        self._written = 0.0
        self._lock = threading.Lock()
        self.server: Any = None
        if port is not None:
            try:
                self.server, _ = prometheus.start_http_server(port, registry=self.registry)
            except OSError as e:
                raise UsageError(
                    f"--metrics-port {port}: cannot serve on it ({e.strerror or e}); choose "
                    "another port"
                ) from None

    def info(self, message: str) -> None:
        self.reporter.info(message)

    def warn(self, message: str) -> None:
        self.reporter.warn(message)

    def phase(self, label: str) -> None:
        self.reporter.phase(label)

    def start(self, stats: RunStats) -> None:
        self.reporter.start(stats)

    def set_total(self, total: int) -> None:
        self.collector.total = total
        self.reporter.set_total(total)

    def update(self, stats: RunStats) -> None:
        self.collector.stats = stats
        self._write(force=False)
        self.reporter.update(stats)

    def finish(self, summary: dict[str, Any]) -> None:
        self.collector.running = False
        self.collector.info = {
            key: summary[key] for key in ("model", "dtype", "device") if summary.get(key)
        }
        self._write(force=True)
        self.reporter.finish(summary)

    def close(self) -> None:
        self.reporter.close()

    def _write(self, force: bool) -> None:
        """Write the metrics file, at most every `FILE_INTERVAL_SECONDS` unless `force`,
        whole or not at all (node_exporter reads it at any time)."""
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self._written < FILE_INTERVAL_SECONDS:
            return
        from prometheus_client import generate_latest

        with self._lock:
            self._written = now
            temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            try:
                temporary.write_bytes(generate_latest(self.registry))
                os.replace(temporary, self.path)
            except OSError as e:
                raise UsageError(f"--metrics-file {self.path}: cannot write it ({e})") from e

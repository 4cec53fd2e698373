"""Prometheus metrics of a run, scraped while it runs, and written for node_exporter."""

import re
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers import records, run_cli, write_jsonl


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _value(text: str, name: str) -> float | None:
    found = re.search(rf"^{name}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M)
    return None if found is None else float(found.group(1))


@pytest.mark.slow
def test_metrics_scraped_during_a_run_show_documents_embedded_rising(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(4000))
    port = _free_port()
    command = [
        sys.executable, "-m", "bulkembed", "run", str(corpus), "--model", str(tiny_st("mean")),
        "--output", str(tmp_path / "out"), "--dtype", "float32", "--max-batch-tokens", "128",
        "--records-per-unit", "100", "--metrics-port", str(port), "--quiet",
    ]  # fmt: skip
    run = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        while run.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                time.sleep(0.05)
                continue
            value = _value(text, "bulkembed_documents_embedded_total")
            if value is not None:
                seen.append(value)
            time.sleep(0.1)
    finally:
        run.wait(timeout=300)
    assert run.returncode == 0, run.stderr.read()
    rising = [b for a, b in zip(seen, seen[1:], strict=False) if b > a]
    assert len(rising) >= 2 and seen == sorted(seen), seen
    assert 0 < seen[-1] <= 4000


def test_a_metrics_file_holds_the_run_for_node_exporter(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(50))
    metrics = tmp_path / "bulkembed.prom"
    result = run_cli(corpus, tiny_st("mean"), tmp_path / "out", "--metrics-file", metrics)
    assert result.exit_code == 0, result.output
    text = metrics.read_text()
    assert _value(text, "bulkembed_documents_embedded_total") == 50
    assert _value(text, "bulkembed_up") == 0
    assert f'output="{tmp_path / "out"}"' in text
    assert re.search(r'^bulkembed_stage_seconds_total\{output="[^"]+",stage="model"\} ', text, re.M)
    assert not list(tmp_path.glob(".bulkembed.prom.*"))


def test_a_port_in_use_is_one_line(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(5))
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(corpus, tiny_st("mean"), tmp_path / "out", "--metrics-port", port)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: --metrics-port {port}: cannot serve on it (")
    assert result.stderr.rstrip().endswith("choose another port")


def test_a_metrics_file_bulkembed_did_not_write_is_not_overwritten(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(5))
    mine = tmp_path / "notes.prom"
    mine.write_text("my own metrics\n")
    result = run_cli(corpus, tiny_st("mean"), tmp_path / "out", "--metrics-file", mine)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: --metrics-file {mine} exists and is not bulkembed's metrics: choose another file"
    )
    assert mine.read_text() == "my own metrics\n"
    ours = tmp_path / "run.prom"
    for _ in range(2):  # an earlier run's file is written over
        assert (
            run_cli(corpus, tiny_st("mean"), tmp_path / "o2", "--metrics-file", ours).exit_code == 0
        )
    assert _value(ours.read_text(), "bulkembed_documents_embedded_total") is not None
